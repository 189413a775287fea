"""verifiers' local runtime inside one envrl sandbox per episode: the harness program and all it runs stay in it, closed
when verifiers stops the runtime; it reaches only the host routes verifiers hands it (docs/sandbox.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shlex
import tomllib
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig
from verifiers.v1.runtimes.subprocess import SubprocessRuntimeInfo

from envrl.runtime.warm import client as warm_client
from envrl.runtime.warm import server as warm_server
from envrl.sandbox import Sandbox, SandboxConfig, SandboxProvider, WarmPool
from envrl.sandbox.argv import SANDBOX_PATH
from envrl.sandbox.venv import sandbox_venv, venvs_root

LOOPBACK = {"127.0.0.1", "localhost"}
_PEP723 = re.compile(r"^# /// script\s*$(.*?)^# ///\s*$", re.MULTILINE | re.DOTALL)
SCRIPTS = ".vf-scripts"
"""Where prepared programs are written in the sandbox's workdir."""
WARM = ".envrl-warm"
"""The warm server's directory in the sandbox's workdir (its socket, its runs' output)."""
_WARM_SERVER = Path(warm_server.__file__).read_text()
_WARM_CLIENT = Path(warm_client.__file__).read_text()


def script_dependencies(script: str) -> list[str]:
    """The `dependencies` of a PEP 723 script's metadata block (none without one)."""
    block = _PEP723.search(script)
    if block is None:
        return []
    text = "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.group(1).splitlines())
    return list(tomllib.loads(text).get("dependencies", []))


class EpisodeSandboxes:
    """Where an env's episodes get their sandboxes: started fresh, or, with `warm` > 0 once the
    harness program is known (`learn`), from a pool of sandboxes already running its warm server."""

    def __init__(self, provider: SandboxProvider, config: SandboxConfig, warm: int = 0) -> None:
        self.provider = provider
        self.config = config
        self.warm = warm
        self.pool: WarmPool | None = None
        self.program: str | None = None
        """The program (its path in the sandbox) the pool's warm servers run."""
        self.prepared: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        """Sandboxes whose warm server of `program` was started."""

    async def create(self) -> Sandbox:
        return await (self.pool or self.provider).create(self.config)

    def learn(self, path: str, script: str, venv: Path) -> None:
        """The harness program episodes run: from now on, sandboxes are started ahead with it warm."""
        if self.warm > 0 and self.pool is None:
            self.program = path

            async def prepare(box: Sandbox) -> None:
                await self._start_warm_server(box, path, script, venv)

            self.pool = WarmPool(self.provider, self.config, self.warm, prepare=prepare)

    async def _start_warm_server(self, box: Sandbox, path: str, script: str, venv: Path) -> None:
        work = self.config.workdir
        await box.write_file(path, script)
        await box.write_file(f"{work}/{WARM}.server.py", _WARM_SERVER)
        server = [str(venv / "bin" / "python"), f"{work}/{WARM}.server.py", f"{work}/{path}", f"{work}/{WARM}/s.sock"]
        await box.run(["mkdir", "-p", f"{work}/{WARM}"])
        # Its stdin is a pipe that never closes: the server lives as long as the sandbox.
        line = f"(sleep 2147483647 | {shlex.join(server)}) > {work}/{WARM}.log 2>&1 < /dev/null &"
        await box.run(["sh", "-c", line])
        self.prepared.add(box)

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()


class SandboxRuntime(Runtime):
    """A verifiers `Runtime` over one envrl sandbox (the `subprocess` runtime's contract, sandboxed)."""

    def __init__(self, config: SubprocessConfig, name: str | None, sandboxes: EpisodeSandboxes) -> None:
        super().__init__(name)
        self.config = config
        self.info = SubprocessRuntimeInfo(**config.model_dump())
        self.sandboxes = sandboxes
        self.sandbox_config = sandboxes.config
        self.box: Sandbox | None = None
        self._warm: dict[tuple[str, ...], Path] = {}
        """Argv prefixes of programs this sandbox runs warm -> their venv."""

    @property
    def _box(self) -> Sandbox:
        if self.box is None:
            raise RuntimeError(f"runtime {self.name}: used before start() or after stop()")
        return self.box

    async def start(self) -> None:
        self.box = await self.sandboxes.create()
        self.info.id = self.sandbox_config.workdir

    async def teardown(self) -> None:
        if self.box is not None:
            await self.box.close()

    async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        result = await self._box.run(argv, env=self.process_env(env))
        return ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def run_program(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        """The harness program, bounded by what the episode's sandbox has left (not a command timeout);
        a fork of the sandbox's warm server of it when there is one."""
        box = self._box
        left = box.time_left("the harness program")
        for prefix, venv in self._warm.items():
            if tuple(argv[: len(prefix)]) == prefix:
                work = self.sandbox_config.workdir
                activated = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:{SANDBOX_PATH}"} if len(prefix) > 2 else {}
                request = {
                    "args": argv[len(prefix) :], "env": self.process_env(env) | activated, "cwd": work,
                    "stdout": f"{work}/{WARM}/run.out", "stderr": f"{work}/{WARM}/run.err",
                }  # fmt: skip
                client = [str(self.sandbox_config.python), "-I", "-S", "-c", _WARM_CLIENT, f"{work}/{WARM}/s.sock"]
                result = await box.run(client, stdin=json.dumps(request), timeout=left)
                break
        else:
            result = await box.run(argv, env=self.process_env(env), timeout=left)
        return ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        line = f"{shlex.join(argv)} > {shlex.quote(log)} 2>&1 < /dev/null &"
        await self._box.run(["sh", "-c", line], env=self.process_env(env))

    async def write(self, path: str, data: bytes) -> None:
        await self._box.write_file(path, data)

    async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self._box.read_file(path, max_bytes if max_bytes is not None else 64 << 20)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        """The script in the sandbox, run by a venv of its dependencies (built on the host)."""
        text = script.decode() if isinstance(script, bytes) else script
        venv = await asyncio.to_thread(sandbox_venv, script_dependencies(text), self.sandbox_config.python)
        path = f"{SCRIPTS}/{hashlib.sha256(text.encode()).hexdigest()}.py"
        await self._box.write_file(path, text)
        interpreter = str(venv / "bin" / "python")
        exports = f'export VIRTUAL_ENV={shlex.quote(str(venv))} PATH="{venv}/bin:$PATH"; exec "$@"'
        argv = [interpreter, path] if not activate else ["sh", "-c", exports, "uv-script", interpreter, path]
        if self._box in self.sandboxes.prepared and self.sandboxes.program == path:
            self._warm[tuple(argv)] = venv
        self.sandboxes.learn(path, text, venv)
        return argv

    async def prepare_execution(self, routes: list[str] | None) -> None:
        """Open the sandbox's way to the episode's host routes (interception, tool servers)."""
        ports = set()
        for route in routes or []:
            parts = urlsplit(route)
            if parts.hostname in LOOPBACK and parts.port is not None:
                ports.add(parts.port)
        if ports:
            await self._box.forward_host_ports(sorted(ports))


def episode_sandbox(config: dict[str, Any]) -> SandboxConfig:
    """An episode's sandbox: `config` (a `SandboxConfig` as a dict) with the sandbox venvs in its
    image (read-only: venvs a program needs are built there while its sandbox runs)."""
    sandbox = SandboxConfig.model_validate(config)
    root = venvs_root()
    return sandbox if root in sandbox.image else sandbox.model_copy(update={"image": [*sandbox.image, root]})
