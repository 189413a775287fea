"""After `own_output_dir(out)`, `out` is a directory this uid owns: one it created has mode 0700, one that existed
keeps its mode, and one another user owns is a `ConfigError` (`refuse_foreign_owner` is that check alone)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from envrl.config import ConfigError


def own_output_dir(out: Path) -> None:
    """Create `out` (mode 0700, parents as the umask says) unless it exists; check who owns it."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a directory: choose another --output-dir")
    with contextlib.suppress(FileExistsError):
        out.mkdir(parents=True, mode=0o700)
    refuse_foreign_owner(out)


def refuse_foreign_owner(out: Path) -> None:
    """ConfigError unless this uid owns the directory `out`."""
    owner = out.stat().st_uid
    if owner != os.geteuid():
        raise ConfigError(
            f"output_dir {out} belongs to uid {owner}, not to this user ({os.geteuid()}): its owner could "
            "read or replace the run's files; choose another --output-dir"
        )
