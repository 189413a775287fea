"""The run's rollout files (train lines, `rollouts/eval/step_<n>.jsonl`; format: `data/rollout_lines.py`): each call
appends its lines in one write, each naming its step, env and policy step; a failed write raises `OSError`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from envrl.data.layout import train_rollouts_file
from envrl.data.rollout_lines import append_lines, trace_line
from envrl.data.traces import Trace
from envrl.orchestrator.scheduler import Group
from envrl.runtime.atomic import write_failure


def append_group(output_dir: Path, step: int, group: Group, counters: Counter[str]) -> None:
    """A train group's rollout lines (the failed attempts its refills replaced after them), each
    outcome and each replaced attempt counted (`counters/refilled_rollouts`: one line more each)."""
    traces = group.all_traces
    append_rollouts(train_rollouts_file(output_dir), step, group.env.name, group.counted_step, traces)
    counters.update(f"outcome_{t.outcome}" for t in traces)
    counters["refilled_rollouts"] += len(group.replaced)


def append_rollouts(path: Path, step: int, env: str, policy_step: int, traces: list[Trace]) -> None:
    try:
        append_lines(path, (trace_line(t, step=step, env=env, policy_step=policy_step) for t in traces))
    except OSError as e:  # a full disk: name the file (a resume drops the cut line)
        raise OSError(e.errno, write_failure(path, e), str(path)) from e
