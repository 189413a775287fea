"""A trainer stopped by SIGTERM (a SLURM job's `--time` limit, `rl` stopping) checkpoints its last trained step
and exits 143; `--resume` trains the next step once, with nothing lost or trained twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from envrl.data.samples import write_batch
from envrl.trainer.checkpoint import list_checkpoints
from tests.support.commands import run_to_completion
from tests.support.run_files import metric_lines, write_batches
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR

TIMEOUT_S = 240
TRAINED = 3
"""Batches there are before the SIGTERM: the trainer trains them, then waits for the next one."""
ARGS = [
    "--micro-batch-tokens=64",
    f"--model.name={TINY_CHAT_DIR}",
    "--ckpt.interval=1000",  # no interval checkpoint: only the SIGTERM and the last step write one
    "--wandb.mode=disabled",
]


def trainer(out: Path, max_steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envrl.trainer", f"--output-dir={out}", f"--max-steps={max_steps}", *ARGS, *extra]


def test_sigterm_checkpoints_the_last_trained_step_and_a_resume_trains_the_next_step_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    write_batches(out, TRAINED, seed=5)
    proc = subprocess.Popen(
        trainer(out, TRAINED + 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (out / "weights" / f"step_{TRAINED}").is_dir():  # the last batch trained: now waiting
            assert proc.poll() is None and time.monotonic() < deadline, "the trainer did not train its batches"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        console, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, console
    assert f"stopped by SIGTERM after {TRAINED} of {TRAINED + 2} steps" in console, console
    assert list_checkpoints(out) == [TRAINED]  # the step trained last, whole (published atomically)

    write_batch(out, TRAINED, synthetic_samples(6, policy_step=TRAINED, seed=5))
    resumed = run_to_completion(trainer(out, TRAINED + 1, "--resume=true"), TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resumed from {out / 'checkpoints' / f'step_{TRAINED}'}" in resumed.stdout
    assert [m["step"] for m in metric_lines(out)] == list(range(TRAINED + 1))  # each step once
    assert list_checkpoints(out)[-1] == TRAINED + 1
