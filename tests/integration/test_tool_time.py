"""Where an agent's rollout time goes: a slow tool shows up by name in the time ledger and in the
report's split of each env's rollout time (a real env server; canned model replies)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from envrl.envclient.config import DeclaredEnvConfig
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.model.client import SamplingParams, ScriptedClientConfig
from envrl.orchestrator.scheduler import BatchShape, Scheduler
from envrl.report.timeline import env_times
from envrl.telemetry.ledger import Ledger, read_ledger
from tests.support.env_servers import running_env_server
from tests.support.slow_tool_env import CALLS

SLEEP_S = 0.3


def test_a_slow_tool_shows_up_by_name_in_the_ledger(tmp_path: Path) -> None:
    args = ["--env.args", json.dumps({"sleep_s": SLEEP_S})]
    client = ScriptedClientConfig(replies=[CALLS])
    with running_env_server(tmp_path, *args, env_id="slow_tool_env:load_environment", client=client) as server:
        env = EnvHandle(
            DeclaredEnvConfig(id="agent", address=server.address),
            split="train",
            client=client,
            sampling=SamplingParams(),
            ready_timeout=60,
        )
        ledger = Ledger.of(tmp_path, "orchestrator")
        shape = BatchShape(group_size=2, batch_size=2, max_inflight=2, max_async_level=0, max_steps=1)
        scheduler = Scheduler(TrainEnvs([env], seed=0), shape, seed=0, counters=Counter(), ledger=ledger)

        async def one_batch() -> None:
            try:
                await env.start()
                await asyncio.wait_for(scheduler.collect(step=0, policy=0), 60)
            finally:
                await scheduler.close()
                await env.shutdown()

        asyncio.run(one_batch())
        ledger.close()
    [rollout] = {s.model_extra["tools"]["slow_lookup"] > 0 for s in read_ledger(tmp_path) if s.name == "rollout"}
    assert rollout, "each rollout's span names the slow tool"
    parts = env_times(read_ledger(tmp_path))[0]["agent"]
    assert set(parts) == {"setup", "model", "tool slow_lookup", "tool add", "scoring"}
    # two rollouts, each awaits asyncio.sleep(SLEEP_S) in slow_lookup, which never returns more than
    # the event loop's clock resolution (1 ns on Linux) early: 1 ms of slack covers it
    assert parts["tool slow_lookup"] >= 2 * SLEEP_S - 1e-3
