"""Two torchrun ranks (gloo, CPU) through the FSDP2 path train the same model as one process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from envrl.config import resolve_config
from envrl.samples import write_batch
from envrl.tiny_model import DEFAULT_DIR
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from envrl.trainer.synthetic import synthetic_samples

from tests.integration.commands import run_to_completion

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT_S = 240
ARGS = {
    "max-steps": "2",
    "max-tokens": "64",
    "model.name": str(DEFAULT_DIR),
    "optim.lr": "3e-3",
    "wandb.mode": "disabled",
}


def test_two_sharded_ranks_match_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        for step in range(2):  # 7 samples in 64-token rows: an odd number of micro-batches to split
            write_batch(out, step, synthetic_samples(7, policy_step=step, seed=3))

    config = resolve_config(TrainerConfig, overrides=[*ARGS.items(), ("output-dir", str(one))])
    Trainer(config, init_runtime(config)).run()

    cli = [f"--{key}={value}" for key, value in {**ARGS, "output-dir": str(two), "ckpt.interval": "2"}.items()]
    proc = run_to_completion([TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "envrl.trainer", *cli], TIMEOUT_S)
    out = proc.stdout
    assert proc.returncode == 0, out

    single = load_file(one / "weights" / "step_2" / "model.safetensors")
    sharded = load_file(two / "weights" / "step_2" / "model.safetensors")
    assert single.keys() == sharded.keys()
    for name in single:
        assert torch.allclose(single[name], sharded[name], atol=1e-6, rtol=1e-5), name
    assert sorted(p.name for p in (two / "checkpoints" / "step_2").iterdir() if p.name.startswith("rng")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]
