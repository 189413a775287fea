"""verifiers' local `subprocess` runtime with its harness programs started from warm interpreters.

Guarantee: inside `warm_programs(pool)`, every runtime verifiers makes for a `subprocess` config
is a `WarmSubprocessRuntime`: it runs a harness's prepared program (`prepare_uv_script`) through
the pool (in a child forked from a warm interpreter of that program, warm_programs.py), with the
argv, environment and working directory the plain runtime would have given it, and answers the
same `ProgramResult`; everything else it runs exactly as the plain runtime does.

Why: a fresh interpreter spends ~1.2 s of CPU importing verifiers' chat program (openai, mcp)
for every rollout; a fork of one that already imported it starts in milliseconds. verifiers
0.4 has no runtime registry, so the seam is its rollout's `make_runtime` (wrapped once, and
only active in a context that names a pool).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import PurePosixPath
from typing import Any

import verifiers.v1.rollout as vf_rollout
from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig, SubprocessRuntime, register

from envrl.envs.adapters.warm_programs import WarmPrograms

_POOL: ContextVar[WarmPrograms | None] = ContextVar("envrl_warm_programs", default=None)
_make_runtime = vf_rollout.make_runtime


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
                run = await self._programs.run(interpreter, program, argv[len(prefix) :], full, self.workdir)
                return ProgramResult(exit_code=run.exit_code, stdout=run.stdout, stderr=run.stderr)
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
