"""A trainer across hosts: 2 ranks on 2 hosts of the box (torchrun's rendezvous on host 0, gloo
between the hosts' own addresses) train bit for bit as the same 2 ranks on one host do from the
same batches (tests/support/layout_parity.py says why the tolerance is zero)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import submit, wait_job, write_job
from tests.integration.test_rl_distributed import STEPS
from tests.support.chaos_runs import ROOT
from tests.support.layout_parity import assert_trained_bit_for_bit_alike


def test_two_ranks_on_two_hosts_train_as_two_ranks_on_one_host_do(cluster: Box, tmp_path: Path) -> None:
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

    one_host = tmp_path / "one_host"
    for step in range(STEPS):
        shutil.copytree(out / "rollouts" / f"step_{step}", one_host / "rollouts" / f"step_{step}")
    torchrun = [sys.executable, "-m", "envrl.launcher.torchrun", "--standalone", "--local-addr", "127.0.0.1"]
    trainer = ["-m", "envrl.runtime.guarded", "envrl.trainer.main", "--config", str(out / "configs" / "trainer.toml")]
    mine = ["--output-dir", str(one_host), "--max-steps", str(STEPS), "--wandb.mode", "disabled"]
    done = subprocess.run(
        [*torchrun, "--nproc-per-node", "2", *trainer, *mine],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    assert_trained_bit_for_bit_alike(out, one_host, STEPS)
