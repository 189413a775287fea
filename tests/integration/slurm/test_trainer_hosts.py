"""A trainer across hosts: 2 ranks on 2 hosts of the box (torchrun's rendezvous on host 0, gloo
between the hosts' own addresses) publish the weights one process trains from the same batches,
within the tolerances test_rl_distributed.py justifies for 2 ranks on one host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from envrl.config import load_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import submit, wait_job, write_job
from tests.integration.test_rl_distributed import COMPARED_METRICS, METRIC_RTOL, STEPS, WEIGHT_ATOL
from tests.support.run_files import metric_lines
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR


def test_two_ranks_on_two_hosts_train_as_one_process_does(cluster: Box, tmp_path: Path) -> None:
    out = tmp_path / "two_hosts"
    overrides = {
        "slurm.nodes": "2", "slurm.trainer-nodes": "2", "slurm.env-node": "1",
        "trainer.weights.transport": "filesystem", "max-steps": str(STEPS), "max-async-level": "0",
        "trainer.optim.lr": "1.0", "trainer.optim.eps": "1.0", "trainer.ckpt.interval": "0",
        "orchestrator.batch-size": "8", "orchestrator.eval.env": "[]",
    }  # fmt: skip
    job = submit(cluster, write_job(out, *[arg for key, value in overrides.items() for arg in (f"--{key}", value)]))
    assert wait_job(cluster, job) == "COMPLETED", (out / "logs" / f"slurm-{job}.out").read_text()[-3000:]
    assert "trainer rank 0/2" in (out / "logs" / "trainer.log").read_text()  # the other rank: host 1's torchrun

    one = tmp_path / "one"
    for step in range(STEPS):
        shutil.copytree(out / "rollouts" / f"step_{step}", one / "rollouts" / f"step_{step}")
    args = ["--config", str(out / "configs" / "trainer.toml"), "--output-dir", str(one), "--max-steps", str(STEPS)]
    config = load_config(TrainerConfig, [*args, "--wandb.mode", "disabled"], prog="trainer")
    Trainer(config, init_runtime(config)).run()

    two_steps = [m for m in metric_lines(out) if "trainer/grad_norm" in m]
    one_steps = [m for m in metric_lines(one) if "trainer/grad_norm" in m]
    assert [m["step"] for m in one_steps] == [m["step"] for m in two_steps] == list(range(STEPS))
    for want, got in zip(one_steps, two_steps, strict=True):
        for key in COMPARED_METRICS:
            assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL), (want["step"], key)
    start = load_file(DEFAULT_DIR / "model.safetensors")
    single = load_file(one / "weights" / f"step_{STEPS}" / "model.safetensors")
    across = load_file(out / "weights" / f"step_{STEPS}" / "model.safetensors")
    assert single.keys() == across.keys()
    for name in single:
        assert not torch.equal(single[name], start[name]), f"{name} was not trained"
        diff = (single[name] - across[name]).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{name}: max abs diff {diff:.2e}"
