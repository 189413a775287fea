"""A trainer across hosts: 2 ranks on 2 hosts of the box (torchrun's rendezvous on host 0, gloo
between the hosts' own addresses) publish the weights one process trains from the same batches,
within the tolerances test_rl_distributed.py justifies for 2 ranks on one host."""

from __future__ import annotations

import shutil
from pathlib import Path

from envrl.config import load_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import submit, wait_job, write_job
from tests.integration.test_rl_distributed import STEPS
from tests.support.layout_parity import assert_trained_as_one_process


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

    assert_trained_as_one_process(out, one, STEPS)
