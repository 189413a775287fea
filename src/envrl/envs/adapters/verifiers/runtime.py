"""verifiers' `subprocess` runtime, its prepared programs forked from warm interpreters (or sandboxed per episode), with
the argv, environment and working directory and `ProgramResult` the plain runtime would give (docs/adapters.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import verifiers.v1.rollout as vf_rollout
import verifiers.v1.runtimes as vf_runtimes
from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig, SubprocessRuntime, register

from envrl.envs.adapters.verifiers.sandbox import EpisodeSandboxes, SandboxRuntime
from envrl.runtime.warm.programs import WarmPrograms, WarmRun


@dataclass(frozen=True)
class Placement:
    """Where the adapter's episodes run local programs: warm forks, and/or one sandbox per episode."""

    programs: WarmPrograms | None = None
    sandboxes: EpisodeSandboxes | None = None
    tools_on_host: bool = False
    """With `sandboxes`: the env allowed runtimes other than an episode's (its tool servers') on the host."""


_PLACEMENT: ContextVar[Placement | None] = ContextVar("envrl_local_runtimes", default=None)
_make_runtime = vf_runtimes.make_runtime
PORT_WAIT_S = 5.0
"""How long a warm tool server's start waits for its port file (past it, verifiers polls as usual)."""


class WarmSubprocessRuntime(SubprocessRuntime):
    """The `subprocess` runtime, but a prepared program's runs go to `programs`' warm servers."""

    def __init__(self, config: SubprocessConfig, name: str | None, programs: WarmPrograms) -> None:
        super().__init__(config, name)
        self._programs = programs
        self._prepared: dict[tuple[str, ...], tuple[str, str, bool]] = {}
        """The argv prefix `prepare_uv_script` returned -> (interpreter, program, activated)."""
        self._warm_runs: list[WarmRun] = []
        """Tool servers running as warm forks, killed at teardown."""

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
                full = self._host_env() | self.process_env(env)
                if activated:
                    full |= _activation(interpreter, full)
                run = await self._programs.run(interpreter, program, argv[len(prefix) :], full, self.workdir)
                return ProgramResult(exit_code=run.exit_code, stdout=run.stdout, stderr=run.stderr)
        return await super().run_program(argv, env)

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        """A tool server verifiers starts as `python -m MODULE` (an MCP toolset): forked from a warm
        interpreter that imported the module, killed when the runtime stops; anything else as verifiers runs it."""
        if len(argv) == 3 and argv[:2] == [sys.executable, "-m"] and self.workdir is not None:
            full = self._host_env() | self.process_env(env)
            path = self.workdir / log
            run = await self._programs.start(sys.executable, f"-m {argv[2]}", [], full, self.workdir, path, path)
            self._warm_runs.append(run)
            if port_file := full.get("MCP_PORT_FILE"):
                await _reported(Path(port_file))
            return
        await super().run_background(argv, env, log)

    async def teardown(self) -> None:
        self._kill_warm_runs()
        await super().teardown()

    def cleanup(self) -> None:
        self._kill_warm_runs()
        super().cleanup()

    def _kill_warm_runs(self) -> None:
        runs, self._warm_runs = self._warm_runs, []
        for run in runs:
            run.kill()

    @staticmethod
    def _host_env() -> dict[str, str]:
        """What SubprocessRuntime gives every process of its own: the host's variables minus API keys."""
        return {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()}


async def _reported(port_file: Path) -> None:
    """Wait (bounded) for a warm tool server to write its port to its port file: verifiers reads it
    at once, then only once a second, so a fork that is ready in milliseconds would cost a second."""
    deadline = asyncio.get_running_loop().time() + PORT_WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(OSError):
            if port_file.read_text().strip().isdigit():
                return
        await asyncio.sleep(0.005)


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


def _make_local_runtime(config: Any, name: str | None = None) -> Runtime:
    """verifiers' `make_runtime`, but a `subprocess` runtime in a placement's context is sandboxed
    (an episode's: the rollout names its runtime by its trace id; tool servers' runtimes have no
    name and stay on the host) or warm."""
    placement = _PLACEMENT.get()
    if placement is None or type(config) is not SubprocessConfig:
        return _make_runtime(config, name)
    runtime: Runtime
    if placement.sandboxes is not None and name is None and not placement.tools_on_host:
        raise RuntimeError(
            "verifiers asked for a runtime on the host (a tool server's) while episodes run sandboxed; set "
            "`tools_on_host = true` in the env's args to allow that"
        )
    if placement.sandboxes is not None and name is not None:
        runtime = SandboxRuntime(config, name, placement.sandboxes)
    elif placement.programs is not None:
        runtime = WarmSubprocessRuntime(config, name, placement.programs)
    else:
        return _make_runtime(config, name)
    register(runtime)
    return runtime


@contextlib.contextmanager
def local_runtimes(placement: Placement) -> Iterator[None]:
    """Within this context (and the tasks it starts), verifiers' local programs run as `placement` says."""
    # An episode's runtime comes from the rollout's `make_runtime`, a tool server's from
    # `provision_runtime` (which looks `make_runtime` up in its own module).
    vf_rollout.make_runtime = vf_runtimes.make_runtime = _make_local_runtime
    token = _PLACEMENT.set(placement)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)
