"""verifiers' local runtime inside an envrl sandbox: a harness program and everything it runs
(a `bash` harness's commands included) confined to one sandbox per episode.

Guarantee: inside `sandboxed(...)`, the runtime verifiers makes for an episode's agent (a
`subprocess` config) is a `SandboxRuntime`: its commands, files, background processes and
harness program run in a sandbox started for the episode and closed when verifiers stops the
runtime (episode end, cancel, timeout; the sandbox's own cap and reaper otherwise). A prepared
PEP 723 program runs on the sandbox's interpreter in a venv of its declared dependencies
(envrl.sandbox.venv, built once per machine). The only host ports the sandbox reaches are the
routes verifiers hands the runtime before the agent starts (its interception server, the tool
servers), at the same URLs (`prepare_execution`). Tool servers verifiers starts for an episode
in runtimes of their own stay on the host, as with the plain runtime.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shlex
import tomllib
from typing import Any
from urllib.parse import urlsplit

from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig
from verifiers.v1.runtimes.subprocess import SubprocessRuntimeInfo

from envrl.sandbox import Sandbox, SandboxConfig, SandboxProvider
from envrl.sandbox.venv import sandbox_venv, venvs_root

LOOPBACK = {"127.0.0.1", "localhost"}
_PEP723 = re.compile(r"^# /// script\s*$(.*?)^# ///\s*$", re.MULTILINE | re.DOTALL)
SCRIPTS = ".vf-scripts"
"""Where prepared programs are written in the sandbox's workdir."""


def script_dependencies(script: str) -> list[str]:
    """The `dependencies` of a PEP 723 script's metadata block (none without one)."""
    block = _PEP723.search(script)
    if block is None:
        return []
    text = "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.group(1).splitlines())
    return list(tomllib.loads(text).get("dependencies", []))


class SandboxRuntime(Runtime):
    """A verifiers `Runtime` over one envrl sandbox (the `subprocess` runtime's contract, sandboxed)."""

    def __init__(
        self, config: SubprocessConfig, name: str | None, sandbox: SandboxConfig, provider: SandboxProvider
    ) -> None:
        super().__init__(name)
        self.config = config
        self.info = SubprocessRuntimeInfo(**config.model_dump())
        self.sandbox_config = sandbox
        self.provider = provider
        self.box: Sandbox | None = None

    @property
    def _box(self) -> Sandbox:
        if self.box is None:
            raise RuntimeError(f"runtime {self.name}: used before start() or after stop()")
        return self.box

    async def start(self) -> None:
        self.box = await self.provider.create(self.sandbox_config)
        self.info.id = self.sandbox_config.workdir

    async def teardown(self) -> None:
        if self.box is not None:
            await self.box.close()

    async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        result = await self._box.run(argv, env=self.process_env(env))
        return ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def run_program(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        """The harness program, bounded by what the episode's sandbox has left (not a command timeout)."""
        box = self._box
        result = await box.run(argv, env=self.process_env(env), timeout=box.time_left("the harness program"))
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
        if not activate:
            return [interpreter, path]
        exports = f'export VIRTUAL_ENV={shlex.quote(str(venv))} PATH="{venv}/bin:$PATH"; exec "$@"'
        return ["sh", "-c", exports, "uv-script", interpreter, path]

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
