"""`sandbox_venv(requirements)`: a venv of the system interpreter, built once per machine, readable by any user, so
it can be a sandbox image."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

from envrl.sandbox.errors import SandboxStartError
from envrl.sandbox.user_dirs import owned_dir

VENVS_ENV = "ENVRL_SANDBOX_VENVS"
"""Overrides where sandbox venvs are kept (a directory any user can reach)."""
SYSTEM_PYTHON = Path("/usr/bin/python3")
COMPLETE = ".envrl-complete"
BUILD_TIMEOUT_S = 600.0


def venvs_root() -> Path:
    """Ours, mode 0755, no one else may write it (checked): outside /tmp, the sandbox's own /tmp."""
    path = Path(os.environ.get(VENVS_ENV) or Path("/var/tmp") / f"envrl-sandbox-venvs-{os.getuid()}")
    return owned_dir(path, 0o755, refuse=0o022, what="sandbox venv directory", fix=f"remove it or set {VENVS_ENV}")


def sandbox_venv(requirements: Sequence[str], python: Path = SYSTEM_PYTHON) -> Path:
    """The venv of `python` with `requirements` installed (built now if no process built it yet).
    `SandboxStartError` naming the failing step if it cannot be built."""
    uv = shutil.which("uv")
    if uv is None:
        raise SandboxStartError("building a sandbox venv needs `uv` on PATH (pip install uv)")
    key = hashlib.sha256("\n".join([str(python), *sorted(requirements)]).encode()).hexdigest()[:16]
    root = venvs_root()
    venv = root / key
    if (venv / COMPLETE).exists():
        return venv
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine; the others wait and find it complete
        if (venv / COMPLETE).exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a build that died half way
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        env.pop("VIRTUAL_ENV", None)
        steps = [[uv, "venv", "--quiet", "--python", str(python), str(venv)]]
        if requirements:
            steps.append([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *requirements])
        for step in steps:
            done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise SandboxStartError(
                    f"building the sandbox venv {venv} failed at `{' '.join(step)}`: {done.stderr[-1500:]}"
                )
        _readable(venv)
        (venv / COMPLETE).touch()
    return venv


def _readable(root: Path) -> None:
    """a+rX on everything under `root` (uv links files from its cache with the cache's modes)."""
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | 0o444 | (0o111 if stat.S_ISDIR(mode) or mode & 0o100 else 0))
    root.chmod(0o755)
