"""One SLURM box (`scripts/slurm_box`) for every cluster test of the session, taken down at its end even
when a test failed (the teardown fails if `down` left a process, namespace, link or directory); each
test's jobs are cancelled, with all they started, before the next test starts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from scripts.slurm_box.box import environ, links, namespaces
from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import run_pids, wait_until
from tests.support.chaos_runs import ROOT

NODES = 3


def box_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scripts.slurm_box", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Box]:
    box = Box(nodes=NODES)
    try:
        started = box_command("up", "--nodes", str(NODES))
        assert started.returncode == 0, f"slurm_box up failed:\n{started.stderr}"
        assert started.stdout.splitlines()[-1] == f"SLURM_CONF={box.conf}", started.stdout
        yield box
    finally:
        stopped = box_command("down")
    assert stopped.returncode == 0, stopped.stderr
    left = subprocess.run(["pgrep", "-f", str(box.root)], capture_output=True, text=True).stdout.split()
    assert (namespaces(), links(), box.root.exists(), left) == ([], [], False, []), "slurm_box down left these behind"


def queued_jobs(box: Box) -> list[str]:
    listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=environ(box), capture_output=True, text=True)
    return listed.stdout.split()


@pytest.fixture(autouse=True)
def no_job_left(cluster: Box) -> Iterator[None]:
    """Every job a test left queued or running (it failed midway) is cancelled and gone, with all it
    started, before the next test submits its own on the same hosts and ports."""
    yield
    if jobs := queued_jobs(cluster):
        subprocess.run(["scancel", *jobs], env=environ(cluster), check=True)
    wait_until("no job left", lambda: not queued_jobs(cluster), 120)
    wait_until("nothing of a run left", lambda: not any(run_pids(cluster, h) for h in range(cluster.nodes)), 120)
