"""Programs run by forks of warm interpreters (the client of server.py): a run answers as a fresh interpreter's would;
a cancelled run is killed with its group, and `aclose` or this process's death stops the servers and their runs."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from envrl.runtime.warm import server as warm_server

SERVER = Path(warm_server.__file__)
READY_TIMEOUT = 180.0
"""Seconds a warm server may take to import its program (a cold disk cache, a loaded box)."""


@dataclass(frozen=True)
class ProgramRun:
    """How a run ended: exit code (negative: killed by that signal) and its output."""

    exit_code: int
    stdout: str
    stderr: str


class WarmPrograms:
    """One env worker's warm servers, one per prepared program, each started on its first run."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._servers: dict[str, asyncio.subprocess.Process] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(self, interpreter: str, program: str, args: list[str], env: dict[str, str], cwd: Path) -> ProgramRun:
        """`interpreter program *args` with `env` in `cwd`, run by a fork of the program's warm server
        (`program`: a file, or "-m NAME" for a module)."""
        run_id = uuid.uuid4().hex
        out, err = self._path(f"{run_id}.out"), self._path(f"{run_id}.err")
        run = await self.start(interpreter, program, args, env, cwd, out, err)
        try:
            code = await run.wait()
            return ProgramRun(exit_code=code, stdout=_read(out), stderr=_read(err))
        finally:
            run.kill()
            for path in (out, err):
                path.unlink(missing_ok=True)

    async def start(
        self,
        interpreter: str,
        program: str,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        stdout: Path,
        stderr: Path,
    ) -> WarmRun:
        """Start a run writing to `stdout` and `stderr` (the same path: one log) and return at once."""
        socket_path = await self._server(interpreter, program, env)
        request = warm_server.RunRequest(args=args, env=env, cwd=str(cwd), stdout=str(stdout), stderr=str(stderr))
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            started = await reader.readline()
        except BaseException:
            writer.close()
            raise
        run = WarmRun(
            reader, writer, int(started) if started.strip().isdigit() else None, f"{program} ({self._log(program)})"
        )
        if run.pid is None:
            run.kill()
            raise RuntimeError(
                f"the warm server of {program} refused a run: {started.decode(errors='replace').strip()}"
            )
        return run

    async def _server(self, interpreter: str, program: str, env: dict[str, str]) -> Path:
        socket_path = self._path(f"{_name(program)}.sock")
        async with self._locks.setdefault(program, asyncio.Lock()):
            server = self._servers.get(program)
            if server is not None and server.returncode is None:
                return socket_path
            socket_path.unlink(missing_ok=True)
            with self._log(program).open("ab") as log:
                server = await asyncio.create_subprocess_exec(
                    interpreter, str(SERVER), program, str(socket_path), env=env,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, start_new_session=True,
                )  # fmt: skip
            self._servers[program] = server
            assert server.stdout is not None
            try:
                line = await asyncio.wait_for(server.stdout.readline(), READY_TIMEOUT)
            except TimeoutError:
                line = b""
            if line.decode().strip() != warm_server.READY:
                await _stop(server)
                raise RuntimeError(
                    f"the warm server of {program} did not start within {READY_TIMEOUT:g} s "
                    f"(exit {server.returncode}); its log: {self._log(program)}"
                )
            logger.info(f"warm server of {program} ready (pid {server.pid})")
            return socket_path

    def _path(self, name: str) -> Path:
        if self._dir is None:
            # Short: a unix socket path must fit in 108 bytes.
            self._dir = Path(tempfile.mkdtemp(prefix="envrl-warm-"))
        return self._dir / name

    def _log(self, program: str) -> Path:
        return self._path(f"{_name(program)}.log")

    async def aclose(self) -> None:
        """Stop every server (each kills its live runs) and remove their sockets and files."""
        servers, self._servers = list(self._servers.values()), {}
        await asyncio.gather(*(_stop(server) for server in servers))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class WarmRun:
    """A started run: `wait()` for its exit code; `kill()` (or closing its caller) stops it with its group."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int | None, what: str) -> None:
        self._reader, self._writer, self.pid, self._what = reader, writer, pid, what

    async def wait(self) -> int:
        exited = await self._reader.readline()
        if not exited.strip().lstrip(b"-").isdigit():
            if self.pid is not None:  # the server died under a started run: the kernel killed the
                _kill_group(self.pid)  # run (its parent-death signal), its group is left to us
            raise RuntimeError(
                f"the warm server of {self._what} ended run {self.pid} without an exit code "
                f"({exited.decode(errors='replace').strip() or 'no answer'})"
            )
        return int(exited)

    def kill(self) -> None:
        """Closing the connection before the run exited makes the server kill it (a no-op after its exit)."""
        self._writer.close()


async def _stop(server: asyncio.subprocess.Process) -> None:
    """Close the server's stdin (it kills its runs and exits); SIGKILL it if it has not within 5 s."""
    if server.stdin is not None:
        server.stdin.close()
    try:
        await asyncio.wait_for(server.wait(), 5.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            server.kill()
        await server.wait()


def _kill_group(pgid: int) -> None:
    """SIGKILL a run's process group (a run leads its own session, so its group id is its pid;
    while the group has a member, that id is not given to another process)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _name(program: str) -> str:
    """A short file name for a program's socket and log (a unix socket path must fit in 108 bytes)."""
    stem = Path(program.removeprefix("-m ")).stem[:12]
    return f"{stem}-{hashlib.sha256(program.encode()).hexdigest()[:8]}"


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace") if path.exists() else ""
