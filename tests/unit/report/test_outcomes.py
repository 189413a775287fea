"""The report counts each step's rollouts that were not scored, per env and outcome."""

from envrl.data.traces import Error, Trace, WireTask
from envrl.report.data import Rollout
from envrl.report.page import step_summary


def rollout(env: str, trace: Trace, split: str = "train") -> Rollout:
    return Rollout(split=split, fields={"env": env, "step": 0}, trace=trace)


def test_a_steps_index_line_counts_unscored_rollouts_per_env_and_outcome() -> None:
    scored = Trace(task=WireTask(idx=0), reward=1.0)
    dead = Trace.from_error(WireTask(idx=0), Error(type="worker_died", message="SIGKILL"))
    raised = Trace.from_error(WireTask(idx=0), Error(type="ValueError", message="bug"))
    cut = Trace(task=WireTask(idx=0), reward=0.0, is_truncated=True)
    rollouts = [rollout("a", scored), rollout("a", dead), rollout("a", dead), rollout("b", raised)]
    rollouts += [rollout("b", cut), rollout("a", dead, split="eval")]
    summary = step_summary(0, rollouts)
    assert summary["outcomes"] == {
        "a": {"infra_error": 2},
        "b": {"env_error": 1, "truncated": 1},
        "a (eval)": {"infra_error": 1},
    }
