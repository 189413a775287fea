"""The `trainer` entry point as a real process on hand-made batch files (CPU, tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from envrl.data.layout import batch_dir
from envrl.data.samples import BATCH_FILE, write_batch
from tests.support.commands import run_to_completion
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

TRAINER = str(Path(sys.executable).parent / "trainer")
TIMEOUT_S = 240


def run_trainer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_to_completion([TRAINER, "--config", str(config), *args], TIMEOUT_S)


def test_trainer_learns_publishes_resumes_and_names_a_corrupt_batch(tmp_path):
    out = tmp_path / "run"
    for step in range(5):
        write_batch(out, step, synthetic_samples(6, policy_step=step, seed=7))
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'output_dir = "{out}"\nmax_steps = 3\nmicro_batch_tokens = 128\n'
        f'[model]\nname = "{DEFAULT_DIR}"\n[optim]\nlr = 3e-3\n[loss]\nclip = false\n'
        '[ckpt]\ninterval = 1\nkeep = 1\n[wandb]\nmode = "disabled"\n'
    )

    first = run_trainer(config)
    assert first.returncode == 0, first.stdout
    losses = [json.loads(line)["trainer/loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0], losses
    reloaded = AutoModelForCausalLM.from_pretrained(out / "weights" / "step_3", dtype=torch.float32)
    assert reloaded(torch.tensor([[1, 5, 9]])).logits.isfinite().all()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_3"]

    corrupt = batch_dir(out, 4) / BATCH_FILE
    corrupt.write_bytes(corrupt.read_bytes()[:100])
    second = run_trainer(config, "--resume", "--max-steps", "5")
    assert second.returncode == 1, second.stdout
    assert f"resumed from {out}/checkpoints/step_3" in second.stdout
    assert (out / "weights" / "step_4").is_dir() and not (out / "weights" / "step_5").exists()
    assert f"trainer stopped: batch file {corrupt} is not valid msgpack" in second.stdout
