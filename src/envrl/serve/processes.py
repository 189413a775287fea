"""The env server's worker processes: each known by its exit fd until `reap` hands it back; `stop_all` returns only
when none is left running; every worker dies with the server."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Collection

from loguru import logger

from envrl.runtime.process import Child, spawn
from envrl.serve.config import EnvServerConfig
from envrl.serve.worker import WORKER_CONFIG_ENV, WORKER_IDENTITY_ENV, WorkerConfig


class WorkerProcesses:
    def __init__(self, config: EnvServerConfig, pool_address: str) -> None:
        self.config = config
        self.pool_address = pool_address
        self.children: dict[int, Child] = {}
        """Live worker processes by worker id."""
        self.by_exit_fd: dict[int, int] = {}
        """Worker id by the exit fd of its process (poll these to see deaths)."""

    def start(self, worker_id: int, identity: bytes) -> int:
        """Spawn worker `worker_id`, whose socket identity is `identity`; return its exit fd."""
        config = self.config
        spec = WorkerConfig(
            worker_id=worker_id, address=self.pool_address, env=config.env, timeout=config.timeout,
            log_file=config.log.file, log_level=config.log.level,
        )  # fmt: skip
        # Both in the environment, not argv: other local users can read a command line
        environ = {**os.environ, WORKER_IDENTITY_ENV: identity.decode(), WORKER_CONFIG_ENV: spec.model_dump_json()}
        child = spawn([sys.executable, "-m", "envrl.serve.worker"], name=f"env worker {worker_id}", env=environ)
        child.log_file = config.log.file
        self.children[worker_id] = child
        self.by_exit_fd[child.exit_fd] = worker_id
        logger.info(f"worker {worker_id} starting (pid {child.pid})")
        return child.exit_fd

    def reap(self, exit_fd: int) -> tuple[int, Child]:
        """(worker id, its exited process) for an exit fd that fired; the fd is closed."""
        worker_id = self.by_exit_fd.pop(exit_fd)
        child = self.children.pop(worker_id)
        child.wait()
        child.close()
        return worker_id, child

    def kill(self, worker_id: int) -> None:
        """SIGKILL a stuck worker; its death is seen through its exit fd like any other."""
        self.children[worker_id].kill()

    def stop_all(self, grace: float, starting: Collection[int] = ()) -> None:
        """Wait up to `grace` seconds for every worker to exit (the server sent the ready ones `stop`),
        then SIGKILL the rest. The workers in `starting` never said ready: they get SIGTERM, as the
        server's `stop` may never reach them (its ROUTER drops a message to a peer that has not
        connected yet, so a worker still importing its env would wait for a `stop` that never comes)."""
        for worker_id in starting:
            child = self.children.get(worker_id)
            if child is not None and child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker_id, child in list(self.children.items()):
            if child.wait(max(0.0, deadline - time.monotonic())) is None:
                logger.warning(f"worker {worker_id} did not stop within {grace:g} s; killing it")
                child.kill()
            child.stop(grace=1.0)
        self.children.clear()
        self.by_exit_fd.clear()
