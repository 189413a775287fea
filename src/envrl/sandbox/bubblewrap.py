"""The local backend: every process in its own namespaces under a host uid of its own, no capability, seccomp, no
inherited environment or fd but the agent's pipes, read-only image and `/`, sized tmpfs; killed whole at its cap,
owner death or `close()`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from envrl.sandbox import reaper, seccomp, uids
from envrl.sandbox.argv import bwrap_argv, check_image, say_memory_bound
from envrl.sandbox.base import CommandResult, Sandbox, SandboxConfig, SandboxProvider, started
from envrl.sandbox.bridge import HostBridge
from envrl.sandbox.errors import (
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxProtocolError,
    SandboxStartError,
    SandboxTimeout,
)
from envrl.sandbox.protocol import AgentChannel, AgentPipes, read_end

UID_BASE, UID_RANGE = uids.FIRST, uids.COUNT
"""The default `sandbox.host_uids`, as [UID_BASE, UID_BASE + UID_RANGE)."""
CLOSE_WAIT_S = 10.0
"""How long `close` waits for bubblewrap to be reaped after SIGKILL (then logs and goes on)."""
ANSWER_GRACE_S = 2.0
"""How long past a command's own timeout the agent may take to answer before it counts as dead."""
_FORWARDER = (Path(__file__).parent / "forwarder.py").read_text()
ISOLATE_DEPRECATED = (
    "Sandbox.run(isolate=True) is deprecated and goes in envrl 0.3: its files were written while the episode "
    "ran, so earlier processes could swap them; run what decides a reward with Sandbox.verdict(cmd, files)"
)


class BubblewrapSandbox(Sandbox):
    """One bubblewrap sandbox with a persistent agent: files and background processes persist across calls."""

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        self.uid: int | None = None
        """Its host user id, claimed at start: every process of this sandbox, and only those, runs as it."""
        self.proc: asyncio.subprocess.Process | None = None
        self._channel: AgentChannel | None = None
        self._stderr_pipe: asyncio.ReadTransport | None = None
        self._record: reaper.Record | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._stderr = bytearray()
        self._tasks: list[asyncio.Task[Any]] = []
        self._watchdog: asyncio.TimerHandle | None = None
        self._bridge: HostBridge | None = None
        self._forwarded: set[int] = set()
        self._uid_in_doubt = False

    @property
    def pid(self) -> int | None:
        """bubblewrap's pid (None before start). To kill the sandbox, kill its uid (`_kill`)."""
        return None if self.proc is None else self.proc.pid

    def restart_clock(self) -> None:
        super().restart_clock()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._arm()

    @property
    def alive(self) -> bool:
        return super().alive and not self._closed and self.proc is not None and self.proc.returncode is None

    def _arm(self) -> None:
        """Kill the sandbox when its episode cap runs out, even if nobody calls it."""
        delay = max(0.0, self.deadline - time.monotonic())
        self._watchdog = asyncio.get_running_loop().call_later(delay, self._kill)

    async def start(self) -> None:
        """Start it; a cancel waits (bounded) for the start it cut short, after killing what it
        started: asyncio cannot reap a half-started bubblewrap whose orphaned child holds its pipes."""
        starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            self._kill()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(starting, CLOSE_WAIT_S)
            self._kill()
            raise

    async def _start(self) -> None:
        if self._closed:
            raise SandboxClosed("start() on a closed sandbox")
        self._arm()
        check_image(self.config)  # a config that cannot start fails before a uid is claimed
        say_memory_bound(self.config.limits)
        program = seccomp.program()
        reaper.reap_now_and_then()
        refused: dict[int, str] = {}
        while True:
            self._record = await asyncio.to_thread(uids.claim_free, *self.config.host_uids, refused)
            self.uid = self._record.uid
            try:
                return await self._launch(program)
            except uids.UidBusy:
                refused[self.uid] = "processes run as it"
                await self._discard_launch()

    async def _launch(self, program: bytes) -> None:
        """Start bubblewrap as the claimed uid and wait for the agent; `uids.UidBusy` (nothing
        started, nothing to kill) when the uid turned out to have processes of its own."""
        assert self.uid is not None
        loop = asyncio.get_running_loop()
        self._bridge = HostBridge(self.uid)
        pipes = AgentPipes()
        filter_in, filter_out = os.pipe()  # the program fits a pipe's buffer: written whole before the spawn
        os.write(filter_out, program)
        os.close(filter_out)
        argv = bwrap_argv(
            self.config, self.uid, self._bridge.directory, agent_fds=pipes.sandbox_fds, seccomp_fd=filter_in
        )
        limit = min(self.config.start_timeout_s, self.time_left("starting the sandbox"))
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=pipes.stderr_out,
                pass_fds=(*pipes.sandbox_fds, filter_in), env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        except OSError as e:
            pipes.close_all()
            raise SandboxStartError(f"cannot start the sandbox ({argv[0]}): {e}") from e
        finally:
            os.close(filter_in)
        pipes.close_sandbox_ends()
        self._channel = await AgentChannel.open(pipes)
        stderr, self._stderr_pipe = await read_end(pipes.stderr_in)
        self._tasks.append(loop.create_task(self._drain_stderr(stderr)))
        try:
            ready = await asyncio.wait_for(self._exchange(None), limit)
        except TimeoutError:
            self._kill()
            if self.deadline <= time.monotonic():
                raise SandboxTimeout(
                    f"the sandbox did not start within its episode cap ({self.config.episode_s:g} s)"
                ) from None
            raise SandboxStartError(f"the sandbox did not start within {limit:g} s (sandbox.start_timeout_s)") from None
        except SandboxError as e:
            raise SandboxStartError(f"the sandbox failed to start: {e}") from None
        if ready != {"ready": True}:
            self._kill()
            raise SandboxStartError(f"the sandbox's agent answered {ready!r} instead of its ready line")
        self._stderr_pipe.close()  # from now on nothing of the sandbox writes anywhere the host reads but answers

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | None = None,
        cwd: str | None = None,
        isolate: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        if isolate:
            warnings.warn(ISOLATE_DEPRECATED, DeprecationWarning, stacklevel=2)
        request = {"op": "run", "stdin": stdin, "cwd": cwd, "isolate": isolate, "env": dict(env or {})}
        return await self._command(request, cmd, timeout)

    async def verdict(
        self, cmd: str | Sequence[str], files: Mapping[str, bytes | str], *, timeout: float | None = None
    ) -> CommandResult:
        for name in files:
            if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
                raise ValueError(f"verdict file name {name!r} must be relative, without '.' or '..' parts")
        raw = {name: data.encode() if isinstance(data, str) else data for name, data in files.items()}
        sent = {name: base64.b64encode(data).decode() for name, data in raw.items()}
        request = {"op": "verdict", "files": sent, "stdin": None, "cwd": self.config.workdir, "env": {}}
        try:
            return await self._command(request, cmd, timeout)
        except SandboxDied as e:  # in the clean room only the judged program ran: an abstention is its failure
            return CommandResult(-9, "", f"the sandbox died during the verdict (its program killed the agent?): {e}")

    async def _command(self, request: dict[str, Any], cmd: str | Sequence[str], timeout: float | None) -> CommandResult:
        wanted = self.config.command_timeout_s if timeout is None else timeout
        left = self.time_left(f"running {_short(cmd)}")
        capped = left < wanted
        request |= {"cmd": cmd if isinstance(cmd, str) else list(cmd), "timeout": min(wanted, left)}
        request["max_output"] = self.config.limits.max_output_kib << 10
        answer = await self._call(request, min(wanted, left) + ANSWER_GRACE_S)
        result = CommandResult(**answer)
        if result.timed_out and capped:
            await self.close()
            self.time_left(f"running {_short(cmd)}")
        return result

    async def forward_host_ports(self, ports: Sequence[int]) -> None:
        """The host bridge allows `ports`, and a forwarder in the sandbox listens on the new ones
        (a command timeout or a verdict kills it with the rest: call this again after one). With
        `network = true` the sandbox shares the host's loopback already: nothing to do."""
        if self.config.network:
            return
        new = sorted(set(ports) - self._forwarded)
        if not new:
            return
        if self._bridge is None:
            raise SandboxClosed("forward_host_ports() before start()")
        await self._bridge.allow(new)
        argv = [str(self.config.python), "-I", "-S", "-c", _FORWARDER, self._bridge.socket_in_sandbox, *map(str, new)]
        result = await self.run(argv, timeout=min(self.config.command_timeout_s, 10.0))
        if result.exit_code != 0:
            raise SandboxStartError(f"the sandbox's forwarder to host ports {new} failed: {result.stderr[-500:]}")
        self._forwarded.update(new)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else data
        request = {"op": "write", "path": path, "data": base64.b64encode(raw).decode(), "mode": mode}
        await self._call(request, self.config.command_timeout_s)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        answer = await self._call({"op": "read", "path": path, "max_bytes": max_bytes}, self.config.command_timeout_s)
        return base64.b64decode(answer["data"])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._kill()
        if self.proc is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), CLOSE_WAIT_S)
            except TimeoutError:
                logger.error(
                    f"sandbox uid {self.uid}: bubblewrap (pid {self.proc.pid}) outlived SIGKILL by {CLOSE_WAIT_S:g} s"
                )
        if self._channel is not None:
            self._channel.close()
        if self._stderr_pipe is not None:
            self._stderr_pipe.close()
        for task in self._tasks:
            task.cancel()
        if self._bridge is not None:
            await self._bridge.close()
        reaper.release(self._record)

    # -- internals ---------------------------------------------------------------------------

    def _kill(self) -> None:
        """SIGKILL every process of the sandbox: all run as its uid, whatever their place in the
        tree: bubblewrap itself and a child of it orphaned by a kill during start-up included.
        (Not `proc.kill()` besides: its poll would reap bubblewrap behind asyncio's child watcher.)
        Never while the launch is found out to have failed on a uid another process has."""
        if self.uid is not None and not self._uid_in_doubt:
            reaper.kill_uid(self.uid)

    async def _uid_was_busy(self) -> bool:
        """After the answer pipe closed before the ready line: whether `setpriv` could not exec
        as the uid because it has processes (bwrap_argv's `--nproc=0`), so nothing of ours runs as it."""
        assert self.proc is not None
        self._uid_in_doubt = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), CLOSE_WAIT_S)
            await asyncio.wait_for(asyncio.gather(*self._tasks), CLOSE_WAIT_S)  # the stderr drain, to its EOF
        busy = self.proc.returncode == 126 and uids.BUSY_MESSAGE in self._stderr
        self._uid_in_doubt = busy
        return busy

    async def _discard_launch(self) -> None:
        """Forget a launch that failed on a busy uid (its setpriv exited; nothing else was started)."""
        for closable in (self._channel, self._stderr_pipe):
            if closable is not None:
                closable.close()
        if self._bridge is not None:
            await self._bridge.close()
        reaper.release(self._record)
        self.uid, self.proc, self._record, self._channel, self._stderr_pipe = None, None, None, None, None
        self._tasks.clear()
        self._stderr.clear()
        self._uid_in_doubt = False

    async def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One op: its answer, `FileNotFoundError`/`OSError` for a file op the agent refused, else a SandboxError."""
        what = f"{request['op']} {_short(request.get('cmd') or request.get('path'))}"
        if self._closed or self.proc is None:
            raise SandboxClosed(f"{what}: the sandbox is closed (episode over or cancelled)")
        async with self._lock:
            timeout = min(timeout, self.time_left(what) + ANSWER_GRACE_S)
            try:
                answer = await asyncio.wait_for(self._exchange(request), timeout)
            except SandboxProtocolError as e:
                self._kill()
                await self.close()
                raise SandboxProtocolError(f"{what}: {e}") from None
            except (TimeoutError, ConnectionError, SandboxDied) as e:
                self._kill()
                await self.close()
                self.time_left(what)  # SandboxTimeout when the cap was the cause
                detail = "no answer in time" if isinstance(e, TimeoutError) else str(e)
                raise SandboxDied(f"{what}: the sandbox stopped answering ({detail})") from None
        if "error" in answer:
            kind = FileNotFoundError if answer.get("kind") == "FileNotFoundError" else OSError
            raise kind(f"{what}: {answer['error']}")
        return answer

    async def _exchange(self, request: dict[str, Any] | None) -> dict[str, Any]:
        """The answer to `request` (None: the agent's ready line); `SandboxDied` if the agent is gone."""
        assert self.proc is not None and self._channel is not None
        try:
            return await (self._channel.ready() if request is None else self._channel.call(request))
        except asyncio.IncompleteReadError:
            if request is None and await self._uid_was_busy():
                raise uids.UidBusy(self.uid) from None
            self._kill()  # the agent is gone: nothing of the sandbox may hold its pipes open
            try:
                code: int | str = await asyncio.wait_for(asyncio.shield(self.proc.wait()), CLOSE_WAIT_S)
            except TimeoutError:
                code = "no exit status"
            tail = self._stderr[-2000:].decode(errors="replace").strip()
            raise SandboxDied(f"bubblewrap exited with {code}" + (f": {tail}" if tail else "")) from None

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        """Keep the tail of bubblewrap's own messages (start-up errors) without ever blocking it."""
        while chunk := await stderr.read(4096):
            self._stderr += chunk
            del self._stderr[:-4096]


class BubblewrapProvider(SandboxProvider):
    """Starts a fresh bubblewrap sandbox per episode."""

    async def create(self, config: SandboxConfig) -> Sandbox:
        return await started(BubblewrapSandbox(config))


def _short(what: object) -> str:
    text = what if isinstance(what, str) else " ".join(map(str, what)) if isinstance(what, (list, tuple)) else str(what)
    return repr(text if len(text) <= 60 else text[:57] + "...")
