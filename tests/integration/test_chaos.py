"""CI-sized chaos: the faults of scripts/chaos/, folded into as few processes as possible.

One `rl` run takes SIGKILLs of env workers, of the train env server, then of the orchestrator and
the trainer together, then of the trainer once more (past its restart budget: the run dies, and
`summary.json` (strict JSON) and the report written after it name the trainer and its exit code),
and `--resume` finishes it (two vLLM start-ups, ~5 min on 2 cores); the disk-full and
corrupt-batch faults hit a `trainer` process alone on hand-made batches (~20 s each).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import NoReturn

import pytest

from envrl.data.layout import published_steps
from envrl.data.samples import BATCH_FILE, write_batch
from envrl.report.headline import headline
from scripts.chaos.corrupt_batch import flip_byte_in_column
from tests.support.chaos_runs import RlRun, account, check_unique_lines, resume
from tests.support.commands import run_to_completion
from tests.support.run_files import metric_lines
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

TRAINER = str(Path(sys.executable).parent / "trainer")


def trainer_steps(out: Path) -> list[int]:
    return [m["step"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "trainer/loss" in m]


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"summary.json holds {name}, which is not JSON")


def check_the_killed_trainer_is_named(out: Path, max_steps: int) -> None:
    """A run that died of its trainer's SIGKILL says so in summary.json and its report."""
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert summary["status"] == "failed" and summary["reason"] == "process failed"
    assert summary["failed_process"] == "trainer" and summary["exit_code"] == -signal.SIGKILL
    assert summary["failed_log"] == str(out / "logs" / "trainer.log")
    assert summary["steps_done"] < max_steps and summary["train_reward"]["first"] is not None
    failure = headline(out)["failure"]
    assert failure["process"] == "trainer" and failure["exit_code"] == -signal.SIGKILL
    assert '"process":"trainer"' in (out / "report" / "index.html").read_text()


def test_killed_workers_env_server_orchestrator_and_trainer_lose_no_rollout_are_named_and_resume(
    tmp_path: Path,
) -> None:
    out, steps = tmp_path / "chaos", 10
    rng = random.Random(0)
    one_restart = ("--restarts.max-restarts", "1")  # each process (env servers too) comes back once
    with RlRun(out, "--max-steps", str(steps), "--trainer.ckpt.interval", "2", *one_restart, report=True) as run:
        run.wait_until("batch 1", lambda: run.steps_done() >= 1)
        stop, worker_kills = threading.Event(), []

        def kill_workers() -> None:  # the first kill at once, then every 4 s until batch 6
            while True:
                worker_kills.append(run.kill_busy_worker(rng, timeout=3.0))
                if stop.wait(4.0):
                    return

        killer = threading.Thread(target=kill_workers)
        killer.start()
        try:
            run.wait_until("batch 3", lambda: run.steps_done() >= 3)
            [server] = run.pids("configs/envs/train/")
            os.kill(server, signal.SIGKILL)
            run.wait_until("batch 6", lambda: run.steps_done() >= 6)
        finally:
            stop.set()
            killer.join()
        # Both pids first, then both kills back to back: each comes back once (its budget), and a
        # second death of the trainer ends the run (the launcher stops the rest).
        victims = {process: run.pids(process) for process in ("envrl.orchestrator.main", "envrl.trainer.main")}
        assert all(victims.values()), victims
        for pids in victims.values():
            os.kill(rng.choice(pids), signal.SIGKILL)
        for process, old in victims.items():
            run.wait_until(f"{process} restarted", lambda p=process, o=old: bool(set(run.pids(p)) - set(o)))
        os.kill(
            rng.choice(sorted(set(run.pids("envrl.trainer.main")) - set(victims["envrl.trainer.main"]))), signal.SIGKILL
        )
        assert run.finish(300) == 1, run.tail()
    assert any(worker_kills)
    assert "train env server 'learnable'" in (out / "logs" / "launcher.log").read_text() and "restarted" in run.tail(
        100_000
    )
    check_the_killed_trainer_is_named(out, steps)  # before the resume writes its own summary

    with resume(run, "--max-steps", str(steps), "--trainer.ckpt.interval", "2") as resumed:
        assert resumed.finish(900) == 0, resumed.tail()
    row = account(out, "ci", "workers, env server, orchestrator + trainer")
    assert row.lost == 0 and row.retried > 0, row
    check_unique_lines(out)
    assert sorted(trainer_steps(out)) == list(range(steps))
    records = metric_lines(out)
    assert sorted(m["step"] for m in records if "train/reward" in m) == list(range(steps))


def trainer_config(tmp_path: Path, out: Path, max_steps: int) -> Path:
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'output_dir = "{out}"\nmax_steps = {max_steps}\nmicro_batch_tokens = 128\nbatch_timeout_s = 30\n'
        f'[model]\nname = "{DEFAULT_DIR}"\n[ckpt]\ninterval = 1\nkeep = 1\n[wandb]\nmode = "disabled"\n'
    )
    return config


def test_a_corrupt_column_stops_the_trainer_naming_file_and_column_before_training(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for step in range(3):
        write_batch(out, step, synthetic_samples(4, policy_step=step, seed=1))
    file = out / "rollouts" / "step_2" / BATCH_FILE
    flip_byte_in_column(file, "advantage")
    result = run_to_completion([TRAINER, "--config", str(trainer_config(tmp_path, out, 3))], 240)
    assert result.returncode == 1, result.stdout
    assert f"batch file {file} is corrupt or incomplete: checksum mismatch in column 'advantage'" in result.stdout
    assert trainer_steps(out) == [0, 1] and published_steps(out / "weights") == [1, 2]


@pytest.fixture
def tmpfs(tmp_path: Path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); scripts/chaos/disk_full.py needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_trainer_naming_the_file_and_a_resume_finishes_once_freed(
    tmp_path: Path, tmpfs: Path
) -> None:
    out = tmpfs / "run"
    for step in range(4):
        write_batch(out, step, synthetic_samples(4, policy_step=step, seed=1))
    free = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (free - 1_500_000))  # room for about one step's weights, not its checkpoint
    config = trainer_config(tmp_path, out, 4)
    full = run_to_completion([TRAINER, "--config", str(config)], 240)
    assert full.returncode == 1, full.stdout
    [error] = [line for line in full.stdout.splitlines() if "trainer stopped" in line]
    assert f"writing {out}/" in error and "the disk is full" in error, error
    for kind, marker in (("weights", "model.safetensors"), ("checkpoints", "trainer_state.pt")):
        assert all((out / kind / f"step_{s}" / marker).is_file() for s in published_steps(out / kind)), kind
    filler.unlink()
    resumed = run_to_completion([TRAINER, "--config", str(config), "--resume"], 240)
    assert resumed.returncode == 0, resumed.stdout
    assert sorted(trainer_steps(out)) == [0, 1, 2, 3] and published_steps(out / "weights")[-1] == 4
