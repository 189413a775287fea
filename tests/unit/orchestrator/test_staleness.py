"""Groups too stale for the step being built are cancelled or dropped, counted and written out;
a background eval that fails stops the loop."""

import asyncio
import json
from pathlib import Path

import pytest

from envrl.envs.model_client import ScriptedClientConfig
from envrl.orchestrator.config import EnvConfig, OrchestratorConfig, SamplingConfig
from envrl.orchestrator.envs import Env
from envrl.orchestrator.loop import Group, Orchestrator
from envrl.traces import Trace, WireTask


def test_stale_groups_are_cancelled_counted_and_recorded(tmp_path: Path) -> None:
    config = OrchestratorConfig(
        output_dir=tmp_path, max_async_level=1, group_size=2, batch_size=4, envs=[EnvConfig(id="x")]
    )
    env = Env(
        config.envs[0],
        split="train",
        client=ScriptedClientConfig(),
        sampling=SamplingConfig(),
        log_dir=tmp_path,
        ready_timeout=1,
    )

    def finished(idx: int) -> list[Trace]:
        return [Trace(task=WireTask(idx=idx), reward=1.0) for _ in range(2)]

    async def scenario() -> tuple[asyncio.Task[None], asyncio.Task[None], Orchestrator]:
        orchestrator = Orchestrator(config)
        orchestrator.ready = [Group(env, 0, 0, 0, finished(0)), Group(env, 1, 0, 2, finished(1))]
        stale_task = asyncio.create_task(asyncio.sleep(60))
        fresh_task = asyncio.create_task(asyncio.sleep(60))
        fresh = Group(env, 6, 0, 2, [])
        orchestrator.inflight = {stale_task: Group(env, 5, 0, 0, []), fresh_task: fresh}
        orchestrator._drop_stale(step=3)  # step 3 may train on policies >= 2
        await asyncio.sleep(0)
        fresh_task.cancel()
        return stale_task, fresh_task, orchestrator

    stale_task, fresh_task, orchestrator = asyncio.run(scenario())
    assert stale_task.cancelled()
    assert [g.task_idx for g in orchestrator.ready] == [1]
    assert not any(t.has_error for t in orchestrator.ready[0].traces)
    assert [(g.task_idx, g.policy_step) for g in orchestrator.inflight.values()] == [(6, 2)]
    assert orchestrator.counters["stale_groups"] == 2
    lines = [json.loads(line) for line in (tmp_path / "rollouts" / "train.jsonl").read_text().splitlines()]
    assert sorted((line["task"]["idx"], line["policy_step"]) for line in lines) == [(0, 0), (0, 0), (5, 0), (5, 0)]
    assert {line["error"]["type"] for line in lines} == {"stale"}


def test_a_background_eval_that_fails_stops_the_next_step(tmp_path: Path) -> None:
    """An eval runs beside training; its failure (an eval env server that stayed down) must not vanish."""
    config = OrchestratorConfig(output_dir=tmp_path, envs=[EnvConfig(id="x")])

    async def scenario() -> None:
        orchestrator = Orchestrator(config)

        async def failing_eval() -> None:
            raise RuntimeError("eval env 'e': the env server did not answer again")

        task = asyncio.create_task(failing_eval())
        orchestrator.evals.add(task)
        task.add_done_callback(orchestrator._eval_done)
        await asyncio.gather(task, return_exceptions=True)
        assert not orchestrator.evals
        await orchestrator._step(1)

    with pytest.raises(RuntimeError, match="did not answer again"):
        asyncio.run(scenario())
