"""After `own_output_dir(out)`, `out` is a directory this uid owns: one it created has mode 0700, one that existed
keeps its mode, and one another user owns, or under a directory another user owns or can write, is a `ConfigError`
(`refuse_foreign_owner` is that check alone)."""

from __future__ import annotations

import contextlib
import os
import stat
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
    """ConfigError unless this uid owns the directory `out` and no other user can replace it:
    every directory above it (as written and as resolved) is root's or this uid's, and writable by
    no one else unless sticky (OpenSSH's secure-path rule, with /tmp's sticky bit allowed), and
    every symbolic link on the way is root's or this uid's. Later accesses by path then reach it."""
    me = os.geteuid()
    written = Path(os.path.abspath(out))
    for place in [*reversed(written.parents), *reversed(Path(os.path.realpath(out)).parents)]:
        info = os.lstat(place)
        if info.st_uid not in (0, me):
            raise ConfigError(
                f"output_dir {out}: {place} above it belongs to uid {info.st_uid}, who could replace it with a "
                "directory of their own after rl's checks; choose an --output-dir under directories only you or "
                "root own"
            )
        if (
            stat.S_ISDIR(info.st_mode)
            and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and not info.st_mode & stat.S_ISVTX
        ):
            raise ConfigError(
                f"output_dir {out}: {place} above it is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'} "
                f"(mode {stat.S_IMODE(info.st_mode):o}, no sticky bit): another user could replace {out} after rl's "
                f"checks and plant a config it runs; `chmod go-w {place}` or choose another --output-dir"
            )
    owner = out.stat().st_uid
    if owner != os.geteuid():
        raise ConfigError(
            f"output_dir {out} belongs to uid {owner}, not to this user ({os.geteuid()}): its owner could "
            "read or replace the run's files; choose another --output-dir"
        )
