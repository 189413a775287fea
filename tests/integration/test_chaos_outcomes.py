"""Every rollout's outcome, against a real env server whose worker is SIGKILLed mid-group: the
dead rollout is an `infra_error` that leaves its group's baseline while its siblings train, and a
refill runs that one rollout again, not its group; an env whose own code raises is an `env_error`
and is not refilled; a model server that does not answer is an `infra_error`. The orchestrator's step runs in-process (its policy a stub: no inference
server); the env server, its workers and the kill are real."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from envrl.config import ModelConfig
from envrl.data.layout import batch_dir, metrics_file, train_rollouts_file
from envrl.data.rollout_lines import parse_trace_line
from envrl.data.samples import read_batch
from envrl.data.seeds import attempt_seed, train_group_seed
from envrl.envclient.client import EnvClient
from envrl.model.client import ScriptedClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator
from envrl.telemetry.metrics import WandbConfig
from tests.support.bad_envs import OK
from tests.support.env_servers import rollout, run, running_env_server
from tests.support.ports import free_port
from tests.support.tiny_chat import TINY_CHAT_DIR as TINY_MODEL

GROUP = 4
FIRST_SEED = train_group_seed(0, 0, GROUP)
"""Rollout i of the run's first group samples with FIRST_SEED + i (seed 0)."""


class ServedPolicy:
    """The policy tracker of a run whose policy 0 is already served: nothing to wait for."""

    current = 0
    waited = 0.0

    async def ensure(self, step: int) -> None:
        pass


def one_step(tmp_path: Path, marker_dir: Path, server_address: str, refill: int) -> None:
    """Step 0 of a run of one group of GROUP rollouts from the env server at `server_address`;
    SIGKILLs the worker of the rollout that hangs (outcome_env) once it runs."""
    config = OrchestratorConfig(
        model=ModelConfig(name=str(TINY_MODEL)),
        output_dir=tmp_path / "run",
        max_steps=1,
        batch_size=GROUP,
        group_size=GROUP,
        refill_rollouts=refill,
        envs=[{"id": "outcome", "address": server_address, "max_retries": 0}],
        wandb=WandbConfig(mode="disabled"),
    )

    async def kill_the_hanging_worker() -> None:
        hang = marker_dir / "hang"
        while not hang.exists() or not hang.read_text():
            await asyncio.sleep(0.05)
        os.kill(int(hang.read_text()), signal.SIGKILL)

    async def step() -> None:
        orchestrator = Orchestrator(config)
        killer = asyncio.create_task(kill_the_hanging_worker())
        try:
            orchestrator.policy = ServedPolicy()  # type: ignore[assignment]
            for env in orchestrator.train_envs.envs:  # canned replies: no inference server
                env.client_config = ScriptedClientConfig(replies=["hi"])
            await asyncio.gather(*(env.start() for env in orchestrator.train_envs.envs))
            await asyncio.wait_for(orchestrator._step(0), 120)
        finally:
            killer.cancel()
            await orchestrator.close()

    asyncio.run(step())


def rollout_lines(tmp_path: Path) -> list[tuple[dict, object]]:
    return [parse_trace_line(line) for line in train_rollouts_file(tmp_path / "run").read_text().splitlines()]


def seeds_run(marker_dir: Path) -> Counter[int]:
    return Counter(int(line.split()[0]) for line in (marker_dir / "runs").read_text().splitlines())


@pytest.fixture
def outcome_server(tmp_path: Path, request: pytest.FixtureRequest):
    """A real env server of outcome_env (two one-slot workers, no re-run of a dead worker's
    rollout inside the server), with the env args `request.param` adds to `marker_dir`."""
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    args = {"marker_dir": str(marker_dir), **request.param}
    pool = '{"min_workers": 2, "max_workers": 2, "multiplex": 1}'
    argv = ["--pool", pool, "--max-reruns", "0", "--env.args", json.dumps(args)]
    with running_env_server(tmp_path, *argv, env_id="outcome_env:load_environment") as server:
        yield server, marker_dir


@pytest.mark.parametrize("outcome_server", [{"hang_seed": FIRST_SEED + 2}], indirect=True)
def test_a_killed_worker_is_an_infra_error_its_siblings_train_on_their_own_baseline(
    tmp_path: Path, outcome_server
) -> None:
    server, marker_dir = outcome_server
    one_step(tmp_path, marker_dir, server.address, refill=0)
    lines = rollout_lines(tmp_path)
    outcomes = [fields["outcome"] for fields, _ in lines]
    assert outcomes == ["scored", "scored", "infra_error", "scored"]
    assert lines[2][1].error.type == "worker_died"
    samples = read_batch(batch_dir(tmp_path / "run", 0))
    # the siblings' rewards are seed % 2: their own mean is the baseline, the dead rollout is not in it
    rewards = [float((FIRST_SEED + i) % 2) for i in (0, 1, 3)]
    mean = sum(rewards) / 3
    # three rewards of 0 or 1 and their mean: exact to within a few ulps
    assert sorted(s.advantage for s in samples) == pytest.approx(sorted(r - mean for r in rewards), abs=1e-12)
    assert sum(seeds_run(marker_dir).values()) == GROUP, "no refill with refill_rollouts = 0"
    metrics = [json.loads(line) for line in metrics_file(tmp_path / "run").read_text().splitlines()]
    step = next(m for m in metrics if "train/outcome/outcome/infra_error" in m)
    assert step["train/outcome/outcome/infra_error"] == 1 and step["train/outcome/outcome/scored"] == 3


@pytest.mark.parametrize("outcome_server", [{"hang_seed": FIRST_SEED + 2}], indirect=True)
def test_a_refill_runs_only_the_killed_rollout_again_and_the_whole_group_trains(tmp_path: Path, outcome_server) -> None:
    server, marker_dir = outcome_server
    one_step(tmp_path, marker_dir, server.address, refill=4)
    runs = seeds_run(marker_dir)
    refill_seed = attempt_seed(FIRST_SEED + 2, 1)
    assert runs == Counter([FIRST_SEED, FIRST_SEED + 1, FIRST_SEED + 2, FIRST_SEED + 3, refill_seed]), (
        "the group's four rollouts, then the killed one alone with a fresh seed"
    )
    lines = rollout_lines(tmp_path)
    assert [fields["outcome"] for fields, _ in lines] == ["scored"] * GROUP + ["infra_error"], (
        "the refilled group, then the failed attempt it replaced, for the record"
    )
    assert len(read_batch(batch_dir(tmp_path / "run", 0))) == GROUP
    [step] = [json.loads(line) for line in metrics_file(tmp_path / "run").read_text().splitlines()]
    assert step["counters/refilled_rollouts"] == 1 and step["train/outcome/outcome/infra_error"] == 1


@pytest.mark.parametrize("outcome_server", [{"raise_seed": FIRST_SEED + 1}], indirect=True)
def test_an_env_whose_own_code_raises_is_an_env_error_and_is_not_refilled(tmp_path: Path, outcome_server) -> None:
    server, marker_dir = outcome_server
    one_step(tmp_path, marker_dir, server.address, refill=4)
    lines = rollout_lines(tmp_path)
    assert [fields["outcome"] for fields, _ in lines] == ["scored", "env_error", "scored", "scored"]
    assert lines[1][1].error.type == "RuntimeError"
    assert sum(seeds_run(marker_dir).values()) == GROUP, "an env error is the env's: running it again is waste"
    assert len(read_batch(batch_dir(tmp_path / "run", 0))) == GROUP - 1


def test_a_model_server_that_does_not_answer_is_an_infra_error(tmp_path: Path) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    client = {"type": "eval", "base_url": base_url, "model": "m", "retry": {"max_retries": 0}}
    with running_env_server(tmp_path, client=client) as server:
        trace = run(rollout(EnvClient(server.address), OK))
    assert trace.error is not None and trace.error.type == "model_unavailable", trace.error
    assert trace.outcome == "infra_error"
