"""Step and eval numbers say what happened: NaN for a mean of nothing, errors apart from unscored rollouts."""

import math

from envrl.orchestrator.stats import rollout_metrics, why_unscored
from envrl.traces import Error, Trace, WireTask


def traces(*kinds: str) -> list[Trace]:
    out = []
    for kind in kinds:
        if kind == "ok":
            out.append(Trace(task=WireTask(idx=0), reward=1.0))
        elif kind == "unscored":
            out.append(Trace(task=WireTask(idx=0)))
        else:
            out.append(Trace.from_error(WireTask(idx=0), Error(type=kind, message="x")))
    return out


def test_reward_is_nan_when_no_rollout_was_scored_and_the_reason_names_the_errors():
    batch = traces("timeout", "timeout", "no_reward", "unscored")
    metrics = rollout_metrics("train/e", batch)
    assert math.isnan(metrics["train/e/reward"])
    assert metrics["train/e/error_rate"] == 0.75 and metrics["train/e/unscored_rate"] == 0.25
    assert why_unscored(batch) == " (no scored rollout: 2 timeout, 1 no_reward, 1 without reward)"


def test_reward_averages_the_scored_rollouts_only():
    metrics = rollout_metrics("e", traces("ok", "timeout", "unscored"))
    assert metrics["e/reward"] == 1.0 and metrics["e/error_rate"] == 1 / 3
