"""`rl replay` recomputes a trainer step from the run's checkpoint and batches, bit for bit, judges
each tensor that differs from what the run published against float32's rounding tolerance, and
names the first one beyond it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from envrl.data.layout import batch_dir, configs_dir, weights_dir
from envrl.data.samples import write_batch
from tests.support.commands import run_to_completion
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

BIN = Path(sys.executable).parent
TIMEOUT_S = 240


def test_replay_matches_the_run_bit_for_bit_then_names_a_tampered_tensor(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for step in range(3):
        write_batch(out, step, synthetic_samples(6, policy_step=step, seed=7))
    config = configs_dir(out) / "trainer.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'output_dir = "{out}"\nmax_steps = 3\nmicro_batch_tokens = 128\n'
        f'[model]\nname = "{DEFAULT_DIR}"\n[optim]\nlr = 3e-3\n'
        '[ckpt]\ninterval = 1\nkeep = 3\n[wandb]\nmode = "disabled"\n'
    )
    trained = run_to_completion([str(BIN / "trainer"), "--config", str(config)], TIMEOUT_S)
    assert trained.returncode == 0, trained.stdout

    replayed = run_to_completion([str(BIN / "rl"), "replay", "--step", "2", str(out)], TIMEOUT_S)
    assert replayed.returncode == 0, replayed.stdout
    assert f"resumed from {out}/checkpoints/step_2" in replayed.stdout
    assert "step 2: loss" in replayed.stdout and "(same as logged)" in replayed.stdout
    assert "every tensor equals" in replayed.stdout

    published = weights_dir(out, 3) / "model.safetensors"
    original = load_file(published)
    name = next(iter(original))

    # One unit in the last place of one entry: what summing in another order (another thread count)
    # leaves; the rounding of the update alone may move an entry by u of the tensor's largest.
    nudged = {**original, name: original[name].clone()}
    first = nudged[name].view(-1)[:1]
    first.copy_(torch.nextafter(first, torch.full_like(first, torch.inf)))
    save_file(nudged, published, metadata={"format": "pt"})
    rounded = run_to_completion([str(BIN / "rl"), "replay", "--step", "2", str(out)], TIMEOUT_S)
    assert rounded.returncode == 0, rounded.stdout
    assert f"{name}: max abs diff" in rounded.stdout and "within its tolerance" in rounded.stdout
    assert "1 tensors differ from" in rounded.stdout and "each within the tolerance" in rounded.stdout

    tampered = {**original, name: original[name].clone()}
    tampered[name].view(-1)[0] += 1.0
    save_file(tampered, published, metadata={"format": "pt"})
    wrong = run_to_completion([str(BIN / "rl"), "replay", "--step", "2", str(out)], TIMEOUT_S)
    assert wrong.returncode == 1, wrong.stdout
    assert f"first tensor beyond its tolerance from {weights_dir(out, 3)} is {name} (max abs diff 1," in wrong.stdout
    assert "BEYOND its tolerance" in wrong.stdout

    shutil.rmtree(batch_dir(out, 1))
    shutil.rmtree(out / "checkpoints" / "step_2")
    missing = run_to_completion([str(BIN / "rl"), "replay", "--step", "2", str(out)], TIMEOUT_S)
    assert missing.returncode == 2, missing.stdout
    assert "batches [1] are gone" in missing.stdout
