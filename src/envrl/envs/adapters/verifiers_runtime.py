"""verifiers' local `subprocess` runtime with its harness programs started from warm interpreters.

Guarantee: inside `warm_programs(pool)`, every runtime verifiers makes for a `subprocess` config
is a `WarmSubprocessRuntime`, which runs a harness's prepared program (`prepare_uv_script`) in a
child forked from a warm server of that program (`warm_program.py`, one per program and env
worker) with the argv, environment and working directory the plain runtime would have given
it, and answers the same `ProgramResult`; anything else it runs exactly as the plain runtime.
A cancelled run is killed with its process group; `WarmPrograms.aclose` (or the worker's death)
stops the servers and their live runs.

Why: a fresh interpreter spends ~1.2 s of CPU importing verifiers' chat program (openai, mcp)
for every rollout; a fork of one that already imported it starts in milliseconds. verifiers
0.4 has no runtime registry, so the seam is its rollout's `make_runtime` (wrapped once, and
only active in a context that names a pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import Any

import verifiers.v1.rollout as vf_rollout
from loguru import logger
from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig, SubprocessRuntime, register

from envrl.envs.adapters import warm_program

SERVER = Path(warm_program.__file__)
READY_TIMEOUT = 180.0
"""Seconds a warm server may take to import its program (a cold disk cache, a loaded box)."""

_POOL: ContextVar[WarmPrograms | None] = ContextVar("envrl_warm_programs", default=None)
_make_runtime = vf_rollout.make_runtime


class WarmPrograms:
    """One env worker's warm servers, one per prepared program, each started on its first run."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._servers: dict[str, asyncio.subprocess.Process] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(
        self, interpreter: str, program: str, args: list[str], env: dict[str, str], cwd: Path
    ) -> ProgramResult:
        """`interpreter program *args` with `env` in `cwd`, run by a fork of the program's warm server."""
        socket_path = await self._server(interpreter, program, env)
        run_id = uuid.uuid4().hex
        out, err = self._path(f"{run_id}.out"), self._path(f"{run_id}.err")
        request = {"args": args, "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            started, exited = await reader.readline(), await reader.readline()
            if not started.strip().isdigit() or not exited.strip().lstrip(b"-").isdigit():
                raise RuntimeError(
                    f"the warm server of {program} ended run {run_id} without an exit code "
                    f"({(started + exited).decode(errors='replace').strip() or 'no answer'}); see {self._log(program)}"
                )
            return ProgramResult(exit_code=int(exited), stdout=_read(out), stderr=_read(err))
        finally:
            # Closing the connection before the run exited (a cancelled rollout) makes the server kill it.
            writer.close()
            for path in (out, err):
                path.unlink(missing_ok=True)

    async def _server(self, interpreter: str, program: str, env: dict[str, str]) -> Path:
        socket_path = self._path(f"{Path(program).stem[:16]}.sock")
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
            if line.decode().strip() != warm_program.READY:
                await _stop(server)
                raise RuntimeError(
                    f"the warm server of {program} did not start within {READY_TIMEOUT:g} s "
                    f"(exit {server.returncode}); its log: {self._log(program)}"
                )
            logger.info(f"warm server of verifiers program {Path(program).name} ready (pid {server.pid})")
            return socket_path

    def _path(self, name: str) -> Path:
        if self._dir is None:
            # Short: a unix socket path must fit in 108 bytes.
            self._dir = Path(tempfile.mkdtemp(prefix="envrl-warm-"))
        return self._dir / name

    def _log(self, program: str) -> Path:
        return self._path(f"{Path(program).stem[:16]}.log")

    async def aclose(self) -> None:
        """Stop every server (each kills its live runs) and remove their sockets and files."""
        servers, self._servers = list(self._servers.values()), {}
        await asyncio.gather(*(_stop(server) for server in servers))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class WarmSubprocessRuntime(SubprocessRuntime):
    """The `subprocess` runtime, but a prepared program's runs go to `programs`' warm servers."""

    def __init__(self, config: SubprocessConfig, name: str | None, programs: WarmPrograms) -> None:
        super().__init__(config, name)
        self._programs = programs
        self._prepared: dict[tuple[str, ...], tuple[str, str, bool]] = {}
        """The argv prefix `prepare_uv_script` returned -> (interpreter, program, activated)."""

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        argv = await super().prepare_uv_script(script, env, activate=activate)
        interpreter, program = await super().prepare_uv_script(script, env, activate=False)  # cached by path
        self._prepared[tuple(argv)] = (interpreter, program, activate)
        return argv

    async def run_program(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        for prefix, (interpreter, program, activated) in self._prepared.items():
            if tuple(argv[: len(prefix)]) == prefix and self.workdir is not None:
                # The environment SubprocessRuntime.run builds (host variables minus API keys).
                full = {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()} | self.process_env(env)
                if activated:
                    full |= _activation(interpreter, full)
                return await self._programs.run(interpreter, program, argv[len(prefix) :], full, self.workdir)
        return await super().run_program(argv, env)


def _activation(interpreter: str, env: dict[str, str]) -> dict[str, str]:
    """What verifiers' activating `sh -c 'export ...; exec "$@"'` wrapper sets for a prepared script."""
    venv = str(PurePosixPath(interpreter).parent.parent)
    home = env.get("HOME", "")
    return {
        "VIRTUAL_ENV": venv,
        "PATH": f"{venv}/bin:{home}/.local/bin:{env.get('PATH', '')}",
        "UV_INSTALL_DIR": f"{home}/.local/bin",
        "UV_RUN_RECURSION_DEPTH": "1",
    }


def _make_warm_runtime(config: Any, name: str | None = None) -> Runtime:
    """verifiers' `make_runtime`, but a `subprocess` runtime in a pool's context is a warm one."""
    programs = _POOL.get()
    if programs is None or type(config) is not SubprocessConfig:
        return _make_runtime(config, name)
    runtime = WarmSubprocessRuntime(config, name, programs)
    register(runtime)
    return runtime


@contextlib.contextmanager
def warm_programs(programs: WarmPrograms) -> Iterator[None]:
    """Within this context (and the tasks it starts), verifiers' local harness programs run warm."""
    vf_rollout.make_runtime = _make_warm_runtime
    token = _POOL.set(programs)
    try:
        yield
    finally:
        _POOL.reset(token)


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


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace") if path.exists() else ""
