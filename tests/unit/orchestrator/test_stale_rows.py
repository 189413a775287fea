"""Every stale group is written to `rollouts/train.jsonl` in the step that dropped it, the last
step's included, by the loop itself (its scheduler and env in-process, its policy a stub)."""

import asyncio
from collections import Counter
from pathlib import Path

from envrl.config import resolve_config
from envrl.data.layout import train_rollouts_file
from envrl.data.rollout_lines import parse_trace_line
from envrl.envclient.handles import TrainEnvs
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator
from envrl.orchestrator.scheduler import BatchShape, Scheduler
from tests.support.scripted_envs import LabelledEnv


class ServedPolicy:
    """The policy tracker of a run whose policy `current` is already served: nothing to wait for."""

    def __init__(self, current: int) -> None:
        self.current = current
        self.waited = 0.0

    async def ensure(self, step: int) -> None:
        pass


def test_a_group_arriving_stale_while_the_last_step_collects_is_written_to_train_jsonl(tmp_path: Path) -> None:
    overrides = [("output-dir", str(tmp_path)), ("envs", '[{"id": "x"}]'), ("max-steps", "3"), ("batch-size", "2"),
                 ("group-size", "2"), ("max-async-level", "1"), ("partial-rollouts", None)]  # fmt: skip
    config = resolve_config(OrchestratorConfig, overrides=overrides)
    # step 2, the last, needs policy >= 1: the first group's tokens come from policy 0 (stale), the next one's from 2
    env = LabelledEnv([[[0], [0]], [[2], [2]]])
    shape = BatchShape(group_size=2, batch_size=2, max_inflight=4, max_async_level=1, max_steps=3)

    async def last_step() -> Counter[str]:
        orchestrator = Orchestrator(config)
        try:
            orchestrator.train_envs = TrainEnvs([env], seed=0)
            orchestrator.scheduler = Scheduler(
                orchestrator.train_envs, shape, seed=0, counters=orchestrator.counters, partial_rollouts=True
            )
            orchestrator.policy = ServedPolicy(current=2)  # type: ignore[assignment]
            await orchestrator._step(2)
            return orchestrator.counters
        finally:
            await orchestrator.close()

    counters = asyncio.run(last_step())
    rows = [parse_trace_line(line) for line in train_rollouts_file(tmp_path).read_text().splitlines()]
    stale = [
        (fields["step"], fields["policy_step"]) for fields, trace in rows if trace.error and trace.error.type == "stale"
    ]
    trained = [(fields["step"], fields["policy_step"]) for fields, trace in rows if trace.error is None]
    assert stale == [(2, 0), (2, 0)], "both rollouts of the group that arrived too old, recorded in step 2"
    assert trained == [(2, 2), (2, 2)]
    assert counters["stale_groups"] == 1
