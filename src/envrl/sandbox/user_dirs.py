"""Per-user directories the sandbox keeps its state in (records, bridges, venvs).

Guarantee: `owned_dir` returns a directory that belongs to this uid and that no other user can
write (or, as asked, read): one another local user planted or loosened is refused, never used.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def owned_dir(path: Path, mode: int, *, refuse: int, what: str, fix: str) -> Path:
    """`path`, created with `mode` if missing, then set to `mode`; PermissionError (naming `what`
    and how to `fix` it) unless it is a directory of this uid with none of the `refuse` bits."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode, parents=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & refuse:
        raise PermissionError(
            f"{what} {path} must be a directory owned by uid {os.getuid()} with mode {mode:04o} "
            f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); {fix}"
        )
    path.chmod(mode)
    return path
