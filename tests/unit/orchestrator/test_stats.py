"""Step and eval numbers say what happened: NaN for a mean of nothing, errors apart from unscored rollouts."""

import math

import pytest

from envrl.data.samples import TrainingSample
from envrl.data.traces import Branch, Error, Trace, Turn, TurnTokens, WireTask
from envrl.envclient.config import EvalTableConfig
from envrl.orchestrator.stats import token_metrics, why_unscored
from envrl.telemetry.rollouts import pass_at_k, rollout_metrics


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


def test_the_reason_names_rollouts_that_never_reached_the_model():
    batch = traces("timeout", "unscored", "unscored", "unscored")
    for trace in batch[1:3]:
        trace.stop_reason = "context_length"
    assert why_unscored(batch) == (
        " (no scored rollout: 1 timeout, 2 without a model turn (context_length), 1 without reward)"
    )


def test_reward_averages_the_scored_rollouts_only():
    metrics = rollout_metrics("e", traces("ok", "timeout", "unscored"))
    assert metrics["e/reward"] == 1.0 and metrics["e/error_rate"] == 1 / 3


def test_pass_at_k_is_the_unbiased_estimator_averaged_over_tasks():
    def group(passed: int, n: int) -> list[Trace]:
        return [Trace(task=WireTask(idx=0), reward=1.0 if i < passed else 0.0) for i in range(n)]

    groups = [group(1, 4), group(0, 4), group(4, 4)]
    out = pass_at_k(groups, threshold=1.0, ks=[2])
    # per task 1 - C(n-c, k)/C(n, k): c=1 -> k=1: 1/4, k=2: 1 - 3/6 = 1/2, k=4: 1; c=0 -> 0; c=4 -> 1
    assert out == {
        "pass@1": pytest.approx((0.25 + 0 + 1) / 3),
        "pass@2": pytest.approx((0.5 + 0 + 1) / 3),
        "pass@4": pytest.approx(2 / 3),
    }


def test_pass_at_must_fit_the_rollouts_per_task():
    with pytest.raises(ValueError, match=r"eval env 'e': pass_at \[8\] outside 1..rollouts_per_example \(4\)"):
        EvalTableConfig(env="e", rollouts_per_example=4, pass_at=[4, 8])


def test_token_metrics_count_generated_stale_and_trained_tokens_per_policy_lag():
    def sample(steps: list[int]) -> TrainingSample:
        mask = [0] + [1] * len(steps)
        return TrainingSample(
            input_ids=[1] * len(mask),
            loss_mask=mask,
            inference_logprobs=[0.0] + [-1.0] * len(steps),
            policy_steps=[-1, *steps],
            advantage=1.0,
            env="e",
            task_idx=0,
            policy_step=min(steps),
        )

    def rollout(n: int) -> Trace:
        tokens = TurnTokens(prompt_ids=[1], completion_ids=[2] * n, completion_logprobs=[-1.0] * n)
        turn = Turn(prompt=[], response={"role": "assistant", "content": ""}, tokens=tokens)
        return Trace(task=WireTask(idx=0), branches=[Branch(turns=[turn])])

    metrics = token_metrics(5, [rollout(3), rollout(4), rollout(2)], [rollout(2)], [sample([4, 5, 5]), sample([5])])
    assert metrics == {
        "tokens/generated": 9.0,
        "tokens/stale": 2.0,
        "samples_spanning_update": 1.0,
        "tokens/lag_0": 3.0,
        "tokens/lag_1": 1.0,
    }
