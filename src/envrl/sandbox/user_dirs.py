"""`owned_dir`: a directory of this uid that no other user can write (or read); a planted or loosened one is refused
with a warning for a private `mkdtemp` beside it, else `SandboxStartError`."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from loguru import logger

from envrl.sandbox.errors import SandboxStartError

_fallbacks: dict[Path, Path] = {}
"""Refused directory -> this process's private replacement."""


def owned_dir(path: Path, mode: int, *, refuse: int, what: str, fix: str) -> Path:
    """`path`, created with `mode` if missing, then set to `mode`, if it is a directory of this uid
    with none of the `refuse` bits; else this process's private replacement (see the module)."""
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode, parents=True)
        info = path.lstat()
    except OSError as e:
        return _fallback(path, mode, f"{what} {path} cannot be created ({e})", fix)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & refuse:
        problem = (
            f"{what} {path} must be a directory owned by uid {os.getuid()} with mode {mode:04o} "
            f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}: planted or loosened by someone else?)"
        )
        return _fallback(path, mode, problem, fix)
    path.chmod(mode)
    return path


def _fallback(path: Path, mode: int, problem: str, fix: str) -> Path:
    if path in _fallbacks:
        return _fallbacks[path]
    try:
        private = Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=_parent(path)))
        private.chmod(mode)
    except OSError as e:
        raise SandboxStartError(f"{problem}; no private directory beside it either ({e}); {fix}") from e
    logger.warning(f"{problem}; this process uses {private} instead (not shared with other processes); {fix}")
    _fallbacks[path] = private
    return private


def _parent(path: Path) -> Path:
    """Where the private replacement goes: beside `path` if that parent is a directory of ours
    or a sticky one (/tmp), else the system temp directory."""
    with contextlib.suppress(OSError):
        info = path.parent.lstat()
        if stat.S_ISDIR(info.st_mode) and (info.st_uid == os.getuid() or info.st_mode & stat.S_ISVTX):
            return path.parent
    return Path(tempfile.gettempdir())
