"""Two hosts simulated on loopback, each running the slice of the run that `rl --slurm`'s batch
script starts there: the same commands and configs (the run's plan, `launcher/plan/run.py`, for hosts
127.0.0.1 and 127.0.0.2), each its own process tree, reaching the others only through the
addresses in its config and one shared output dir.

Host B (127.0.0.2) runs the inference server, the env server (behind CURVE: it is not host A's,
where the orchestrator runs; the keys are the ones the job makes) and trainer rank 1; host A
(127.0.0.1) runs trainer rank 0 (torchrun's rendezvous) and the orchestrator. Batches and weights
cross "hosts" through the output dir, as they would through a shared filesystem (docs/scale.md).
Starts one vLLM, so it runs under the heavy lock.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from envrl.config import resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.commands import Command
from envrl.launcher.plan.run import Machine, plan
from envrl.launcher.run_keys import make_secrets
from envrl.launcher.slurm import write_job_files
from tests.support.chaos_runs import MARKER, ROOT, SMOKE, marked_pids
from tests.support.ports import free_port
from tests.support.run_files import metric_lines

STEPS = 3
HOST_A, HOST_B = "127.0.0.1", "127.0.0.2"
RELOADED = re.compile(r"weights reloaded from (\S+)/step_(\d+) in")


class Host:
    """One simulated machine: its commands share a marker in their environment and nothing else."""

    def __init__(self, name: str) -> None:
        self.name, self.marker = name, uuid.uuid4().hex
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self, command: Command, secrets: dict[str, str]) -> subprocess.Popen[bytes]:
        """`command` as the batch script's srun step runs it: its output to its log, the job's
        secrets it names in its environment (an env server never names the reload token)."""
        with command.log_file.open("wb") as log:
            proc = subprocess.Popen(
                command.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**command.environ(secrets), MARKER: self.marker, "WANDB_MODE": "offline"},
            )  # fmt: skip
        self.procs[command.name] = (proc, command.log_file)
        return proc

    def log(self, name: str) -> str:
        return self.procs[name][1].read_text(errors="replace")

    def stop(self) -> None:
        for pid in marked_pids(self.marker):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    a, b = Host("host-a"), Host("host-b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def wait_healthy(host: Host, name: str, url: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    proc = host.procs[name][0]
    while True:
        assert proc.poll() is None, f"{name} on {host.name} died:\n{host.log(name)[-3000:]}"
        assert time.monotonic() < deadline, f"{name} not serving {url} after {timeout} s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)


def test_the_slurm_slices_of_two_hosts_train_through_addresses_and_a_shared_dir(tmp_path: Path) -> None:
    out = tmp_path / "shared" / "run"
    overrides = [("output-dir", str(out)), ("max-steps", str(STEPS)), ("max-async-level", "0"),
                 ("orchestrator.eval.env", "[]"), ("inference.port", str(free_port())),
                 ("env-server-base-port", str(free_port())), ("slurm.nodes", "2"), ("slurm.trainer-nodes", "2"),
                 ("slurm.inference-nodes", "1"), ("slurm.env-node", "1"),
                 ("slurm.rendezvous-port", str(free_port()))]  # fmt: skip
    job = plan(resolve_config(RLConfig, [SMOKE], overrides=overrides), [HOST_A, HOST_B], Machine.here())
    write_job_files(job)
    assert [c.name for c in job.on_host(0)] == ["trainer", "orchestrator"]
    assert [c.name for c in job.on_host(1)] == ["inference", "train env server 'learnable'", "trainer-node1"]
    secrets = make_secrets(job.secrets)  # the job's environment holds them (the batch script makes them)

    with two_hosts() as (a, b):
        hosts = [a, b]
        order = job.start_order()
        servers = [(i, c) for i, c in order if not c.name.startswith(("trainer", "orchestrator"))]
        for i, command in servers:
            hosts[i].start(command, secrets)
        wait_healthy(b, "inference", job.replicas["inference"].base_url)
        for i, command in order[len(servers) :]:
            hosts[i].start(command, secrets)
        assert a.procs["orchestrator"][0].wait(900) == 0, a.log("orchestrator")[-3000:]
        for host, name in ((a, "trainer"), (b, "trainer-node1")):
            assert host.procs[name][0].wait(300) == 0, host.log(name)[-3000:]

        reloads = [(Path(path), int(step)) for path, step in RELOADED.findall(b.log("inference"))]
        assert reloads == [((out / "weights").resolve(), step) for step in range(1, STEPS)], reloads
        assert "trainer rank 0/2" in a.log("trainer"), "host B's rank did not join the rendezvous"
        assert job.configs()["envs/train/learnable"].curve is not None, "host B's env server is not behind CURVE"

    records = metric_lines(out)
    assert [m["step"] for m in records if "train/reward" in m] == list(range(STEPS))
    assert [m["step"] for m in records if "trainer/loss" in m] == list(range(STEPS))
    assert (out / "weights" / f"step_{STEPS}" / "model.safetensors").exists()
    assert (out / "checkpoints" / f"step_{STEPS}" / "rng_rank1.pt").exists(), "host B's rank saves into the shared dir"
