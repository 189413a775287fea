"""The env servers a standalone orchestrator or `rl eval` starts itself: each is supervised and restarted on its address
within its `RestartPolicy`, demands the CURVE keys of `output_dir`, and is stopped with its group by `close`."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import threading
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from envrl.data.layout import curve_dir, env_log_file
from envrl.envclient.curve import make_curve_keys, sidecar_keys
from envrl.runtime.process import Child
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor
from envrl.serve.launch import EnvServerLaunch
from envrl.serve.launch import start as start_env_server

STOP_GRACE_S = 10.0
"""Seconds a server has to drain after SIGTERM before it is killed."""


class Sidecars:
    """The env servers this process spawned, their supervisor and its thread."""

    def __init__(self, output_dir: Path, restarts: RestartPolicy, *, ready_timeout: float) -> None:
        self.output_dir = output_dir
        self.restarts = restarts
        self.ready_timeout = ready_timeout
        self.supervisor = Supervisor(grace=STOP_GRACE_S)
        self.curve = sidecar_keys(output_dir)
        """The keys every server spawned here demands (the server's) and its client holds."""
        self._making_keys = threading.Lock()
        self._ended: BaseException | None = None
        self._ended_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._names: dict[str, str] = {}
        """Each server's address -> its process name (`train env server 'name'`)."""

    async def serve(self, launch: EnvServerLaunch, on_restart: Callable[[], None]) -> str:
        """Make the keys, spawn the planned server (`envclient/plan.py`), supervise it; the address it bound.
        `on_restart` is called (on the supervisor's thread) each time it is back after a death."""
        if launch.config.curve != self.curve[0]:
            raise ValueError(
                f"{launch.title}: a sidecar must demand the CURVE keys in {curve_dir(self.output_dir)}, not "
                f"{launch.config.curve}; plan it with plan_env(..., curve=sidecar_keys(output_dir)) (envclient/plan.py)"
            )
        await asyncio.to_thread(self._make_keys)
        log_file = env_log_file(self.output_dir, launch.split, launch.name)
        child, address = await asyncio.to_thread(self._start, launch, log_file)
        again = launch.model_copy(update={"config": launch.config.model_copy(update={"address": address})})

        def respawn() -> Child:
            new = self._start(again, log_file)[0]
            on_restart()
            return new

        self._names[address] = child.name
        self.supervisor.add(child, Respawn(respawn, self.restarts))
        self._watch()
        return address

    def _make_keys(self) -> None:
        with self._making_keys:  # envs start at once: one makes the keys, the others find them made
            make_curve_keys(curve_dir(self.output_dir))

    def _start(self, launch: EnvServerLaunch, log_file: Path) -> tuple[Child, str]:
        argv = launch.argv(launch.write_config(self.output_dir))
        return start_env_server(launch, argv=argv, log_file=log_file, ready_timeout=self.ready_timeout)

    def pid(self, address: str) -> int | None:
        """The pid of the server serving `address` now (None: not one of these)."""
        name = self._names.get(address)
        return next((child.pid for child in list(self.supervisor.children) if child.name == name), None)

    async def ended(self) -> BaseException:
        """Wait until supervision ends (a server out of restarts); why it ended."""
        assert self._ended_event is not None, "ended() before any server was served"
        await self._ended_event.wait()
        assert self._ended is not None
        return self._ended

    def _watch(self) -> None:
        if self._watcher is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._ended_event = asyncio.Event()
        self._watcher = threading.Thread(target=self._supervise, name="env-server-supervisor", daemon=True)
        self._watcher.start()
        atexit.register(self._stop_all)

    def _supervise(self) -> None:
        try:
            self.supervisor.watch(set(), progress_every=math.inf, stop=self._stop)
        except BaseException as e:  # noqa: BLE001 - handed to every wait for a lost server
            logger.error(f"env servers: supervision ended: {e}")
            self._ended = e
            assert self._loop is not None and self._ended_event is not None
            with contextlib.suppress(RuntimeError):  # the loop already closed: nobody waits any more
                self._loop.call_soon_threadsafe(self._ended_event.set)

    def _stop_all(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()  # a restart under way finishes first, so its server is stopped too
        self.supervisor.stop_all()

    async def close(self) -> None:
        """Stop supervising, then stop every server (SIGTERM, SIGKILL after the grace period)."""
        await asyncio.to_thread(self._stop_all)
        atexit.unregister(self._stop_all)
