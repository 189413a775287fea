"""The parts the loop wires, on their own: a step's samples and counters (`batch.py`), its rollout
lines (`rollout_files.py`) and its metrics (`step_report.py`), with in-process train envs."""

from collections import Counter
from pathlib import Path

from envrl.config import resolve_config
from envrl.data.layout import train_rollouts_file
from envrl.data.rollout_lines import parse_trace_line
from envrl.data.traces import Error, Trace, WireTask
from envrl.orchestrator.batch import BatchBuilder
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.rollout_files import append_group
from envrl.orchestrator.scheduler import Group
from envrl.orchestrator.step_report import train_metrics
from tests.support.scripted_envs import AnsweringEnv, labelled_trace


def scored(reward: float) -> Trace:
    trace = labelled_trace(0, [1, 1])
    trace.reward = reward
    return trace


def config(tmp_path: Path, *overrides: tuple[str, str | None]) -> OrchestratorConfig:
    base = [("output-dir", str(tmp_path)), ("envs", '[{"id": "x"}]'), ("group-size", "2"), ("batch-size", "4")]
    return resolve_config(OrchestratorConfig, overrides=[*base, *overrides])


def groups() -> list[Group]:
    env = AnsweringEnv()
    failed = Trace.from_error(WireTask(idx=1), Error(type="timeout", message="x"))
    return [
        Group(env=env, task_idx=0, seed=0, policy_step=1, traces=[scored(1.0), scored(0.0)]),
        Group(env=env, task_idx=1, seed=1, policy_step=0, traces=[scored(1.0), failed]),
        Group(env=env, task_idx=2, seed=2, policy_step=1, traces=[scored(0.5), scored(0.5)]),
    ]


def test_each_group_is_recorded_once_in_order_and_each_rollout_counted(tmp_path: Path) -> None:
    counters: Counter[str] = Counter()
    builder = BatchBuilder(config(tmp_path, ("advantage.drop-zero-variance", "true")), counters)
    batch = groups()
    recorded: list[Group] = []
    samples = builder.samples(batch, recorded.append)
    assert recorded == batch
    assert counters["error_rollouts"] == 1 and counters["unscored_rollouts"] == 0
    assert counters["dropped_groups"] == 2, "group 1 (one scored rollout: no baseline), group 2 (equal rewards)"
    assert len(samples) == 2 and {s.policy_step for s in samples} == {1}
    assert builder.seq_counts["x"].samples == 2


def test_a_groups_lines_name_its_step_and_policy_and_count_each_outcome(tmp_path: Path) -> None:
    counters: Counter[str] = Counter()
    for group in groups()[:2]:
        append_group(tmp_path, 5, group, counters)
    rows = [parse_trace_line(line)[0] for line in train_rollouts_file(tmp_path).read_text().splitlines()]
    assert [(row["step"], row["env"], row["policy_step"]) for row in rows] == [(5, "x", 1)] * 2 + [(5, "x", 0)] * 2
    assert counters["outcome_env_error"] + counters["outcome_infra_error"] == 1
    assert sum(n for key, n in counters.items() if key.startswith("outcome_")) == 4


def test_train_metrics_average_over_the_baseline_and_staleness_over_groups(tmp_path: Path) -> None:
    batch = groups()
    builder = BatchBuilder(config(tmp_path), Counter())
    samples = builder.samples(batch, lambda group: None)
    metrics = train_metrics(2, batch, [], samples, builder.seq_counts, seconds=2.0)
    # every scored rollout counts, even group 1's lone one (its group trains nothing): 1, 0, 1, 0.5, 0.5;
    # the sum 3.0 is exact in binary and 3 / 5 is the same one correctly rounded division as the code's
    assert metrics["train/reward"] == 3 / 5
    assert metrics["train/x/staleness"] == (1 + 2 + 1) / 3  # the same division as the code's
    assert metrics["train/error_rate"] == 1 / 6  # the same one division as the code
    assert metrics["perf/rollouts_per_s"] == 3.0
    assert metrics["train/samples"] == len(samples)
