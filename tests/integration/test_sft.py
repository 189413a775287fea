"""`rl sft` fine-tunes a model on demonstrations and publishes one that `rl` can start from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.support.commands import run_to_completion
from tests.support.run_files import metric_lines
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

RL = str(Path(sys.executable).parent / "rl")
TIMEOUT_S = 300
WORDS = ["cat", "dog", "owl", "elk", "emu", "yak", "ant", "bee"]


def sft_losses(out: Path) -> list[tuple[float, float]]:
    lines = metric_lines(out)
    return [(r["sft/loss"], r["sft/token_accuracy"]) for r in lines if r.get("process") == "sft"]


def test_sft_learns_the_demonstrations_and_publishes_a_loadable_model(tmp_path: Path) -> None:
    data = tmp_path / "demos.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]})
            + "\n"
            for w in WORDS
        )
    )
    out = tmp_path / "sft"
    argv = [RL, "sft", "--model.name", str(DEFAULT_DIR), "--data", str(data), "--output-dir", str(out)]
    run = run_to_completion([*argv, "--epochs", "30", "--batch-size", "8", "--optim.lr", "1e-2"], TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "8 conversations from" in run.stdout and "step 30/30 (epoch 30/30)" in run.stdout

    steps = sft_losses(out)
    assert len(steps) == 30
    (first_loss, first_accuracy), (last_loss, last_accuracy) = steps[0], steps[-1]
    assert last_loss < first_loss / 4, steps
    assert last_accuracy > first_accuracy, steps

    final = out / "weights" / "final"
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    assert model(torch.tensor([[1, 5, 9]])).logits.isfinite().all()

    again = run_to_completion([*argv], TIMEOUT_S)  # never overwrites a finished run
    assert again.returncode == 1 and f"{final} already exists" in again.stdout
