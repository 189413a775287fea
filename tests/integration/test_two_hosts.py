"""Two hosts simulated on loopback: every role is its own command, in its own process tree, and
reaches the others only through the addresses in its config and one shared output dir.

Host B (127.0.0.2) runs the inference server, an env server behind CURVE and trainer rank 1;
host A (127.0.0.1) runs trainer rank 0 (torchrun's rendezvous) and the orchestrator. Batches and
weights cross "hosts" through the output dir, as they would through a shared filesystem
(docs/scale.md). Starts one vLLM, so it runs under the heavy lock (measured: 100 s on 2 shared cores).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from pydantic import BaseModel

from envrl.config import config_to_toml, resolve_config
from envrl.launcher.config import RLConfig, resolve_run
from envrl.serve.config import CurveServerConfig
from tests.integration.curve_keys import make_curve_keys
from tests.support.chaos_runs import MARKER, ROOT, SMOKE, marked_pids
from tests.support.ports import free_port
from tests.support.run_files import metric_lines

STEPS = 3
HOST_A, HOST_B = "127.0.0.1", "127.0.0.2"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
RELOADED = re.compile(r"weights reloaded from (\S+)/step_(\d+) in")


class Host:
    """One simulated machine: its commands share a marker in their environment and nothing else."""

    def __init__(self, name: str, root: Path) -> None:
        self.name, self.dir, self.marker = name, root / name, uuid.uuid4().hex
        self.dir.mkdir(parents=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def write(self, name: str, config: BaseModel) -> Path:
        path = self.dir / f"{name}.toml"
        path.write_text(config_to_toml(config))
        return path

    def start(self, role: str, argv: Sequence[str], **env: str) -> subprocess.Popen[bytes]:
        with (self.dir / f"{role}.log").open("wb") as log:
            self.procs[role] = subprocess.Popen(
                list(argv), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, MARKER: self.marker, "WANDB_MODE": "offline", **env},
            )  # fmt: skip
        return self.procs[role]

    def log(self, role: str) -> str:
        return (self.dir / f"{role}.log").read_text(errors="replace")

    def stop(self) -> None:
        for pid in marked_pids(self.marker):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def two_hosts(root: Path) -> Iterator[tuple[Host, Host]]:
    a, b = Host("host-a", root), Host("host-b", root)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def wait_healthy(host: Host, role: str, url: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert host.procs[role].poll() is None, f"{role} on {host.name} died:\n{host.log(role)[-3000:]}"
        assert time.monotonic() < deadline, f"{role} not serving {url} after {timeout} s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)


def test_a_run_spread_over_two_hosts_trains_through_addresses_and_a_shared_dir(tmp_path: Path) -> None:
    out = tmp_path / "shared" / "run"
    overrides = [("output-dir", str(out)), ("max-steps", str(STEPS)), ("max-async-level", "0"),
                 ("orchestrator.eval.env", "[]"), ("inference.host", HOST_B), ("inference.port", str(free_port()))]  # fmt: skip
    run = resolve_run(resolve_config(RLConfig, [SMOKE], overrides=overrides))
    keys = make_curve_keys(tmp_path)
    env_address = f"tcp://{HOST_B}:{free_port()}"
    [env] = run.orchestrator.envs
    env.address, env.curve = env_address, keys.client
    [server] = run.env_servers
    env_server = server.config.model_copy(
        update={"address": env_address, "curve": CurveServerConfig.model_validate_json(keys.server)}
    )
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", HOST_A, "--master-port", str(free_port())]
    token = {"ENVRL_RELOAD_TOKEN": uuid.uuid4().hex}  # what a server off loopback requires; checked here too

    with two_hosts(tmp_path) as (a, b):
        python = sys.executable
        b.start(
            "inference",
            [python, "-m", "envrl.inference.main", "--config", str(b.write("inference", run.inference))],
            **token,
        )
        b.start("env-server", [python, "-m", "envrl.serve.main", "--config", str(b.write("env-server", env_server))])
        wait_healthy(b, "inference", run.inference.base_url)
        for host, rank in ((a, 0), (b, 1)):
            trainer = [TORCHRUN, *rendezvous, "--node-rank", str(rank), "-m", "envrl.trainer"]
            host.start("trainer", [*trainer, "--config", str(host.write("trainer", run.trainer))])
        orchestrator = a.start(
            "orchestrator",
            [python, "-m", "envrl.orchestrator.main", "--config", str(a.write("orchestrator", run.orchestrator))],
            **token,
        )
        assert orchestrator.wait(900) == 0, a.log("orchestrator")[-3000:]
        for host in (a, b):
            assert host.procs["trainer"].wait(300) == 0, host.log("trainer")[-3000:]

        reloads = [(Path(path), int(step)) for path, step in RELOADED.findall(b.log("inference"))]
        assert reloads == [((out / "weights").resolve(), step) for step in range(1, STEPS)], reloads
        assert "trainer rank 0/2" in a.log("trainer"), "host B's rank did not join the rendezvous"

    records = metric_lines(out)
    assert [m["step"] for m in records if "train/reward" in m] == list(range(STEPS))
    assert [m["step"] for m in records if "trainer/loss" in m] == list(range(STEPS))
    assert (out / "weights" / f"step_{STEPS}" / "model.safetensors").exists()
    assert (out / "checkpoints" / f"step_{STEPS}" / "rng_rank1.pt").exists(), "host B's rank saves into the shared dir"
