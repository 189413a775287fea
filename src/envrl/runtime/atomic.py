"""Atomic publishing: an `atomic_dir` appears under its final name only once every file in it is written and fsynced
(a crash leaves a hidden `.tmp`); `filter_lines` replaces a JSON-lines file in one rename, losing no appended line."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_file(path: Path | str) -> None:
    """Flush what was written to the file `path` (by any process) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (and `root` itself) to disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(final: Path) -> Path:
    """The hidden temp name `final` is written under before the rename (same dir, so same fs)."""
    return final.parent / f".{final.name}.tmp"


def publish(tmp: Path, final: Path) -> None:
    """fsync `tmp` and rename it to `final`; FileExistsError if `final` is already there."""
    fsync_tree(tmp)
    if final.exists():
        raise FileExistsError(f"{final} already exists; refusing to replace a published directory")
    os.rename(tmp, final)
    _fsync_dir(final.parent)


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temp dir; on clean exit publish it as `final`, on error remove it.

    A leftover temp dir from a crashed writer is removed first (its content was never published).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        raise FileExistsError(f"{final} already exists; refusing to replace a published directory")
    tmp = temp_sibling(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_failure(path: Path, error: BaseException) -> str:
    """What went wrong writing `path`, with the free space of its filesystem (a full disk often
    surfaces as an error that names neither: torch's writers raise RuntimeError)."""
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    detail = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    hint = "; the disk is full: free space, then resume the run (--resume)" if free < FULL_BELOW else ""
    return (
        f"writing {path} failed ({type(error).__name__}: {detail}); {free / 2**20:.1f} MiB free on its filesystem{hint}"
    )


FULL_BELOW = 64 * 2**20
"""Free bytes under which `write_failure` calls the disk full."""


def write_file(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write and fsync `data` to `path` (`private`: mode 0600 before any byte is written); an
    OSError (a full disk) names the file it failed on."""
    try:
        with path.open("wb") as f:
            if private:
                os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} (writing {len(data)} bytes)", str(path)) from e


def atomic_write_text(path: Path, text: str | bytes, *, private: bool = False) -> None:
    """Replace the file `path` with `text` so that readers see the old or the new content, never
    half (`private`: a file of this user's only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        write_file(tmp, text.encode() if isinstance(text, str) else text, private=private)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _lock_file(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


@contextmanager
def shared_lock(path: Path) -> Iterator[None]:
    """Held by an appender of the JSON-lines file `path` while it writes (many may hold it at once)."""
    with _locked(path, fcntl.LOCK_SH):
        yield


@contextmanager
def _locked(path: Path, how: int) -> Iterator[None]:
    fd = os.open(_lock_file(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def filter_lines(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Drop the JSON lines of `path` that `keep` rejects, and lines that are not JSON objects (cut
    short by a crash or a full disk); return how many were dropped. The file is rewritten beside
    and renamed over, so a crash leaves the old or the new file; appenders that re-open the path
    after taking `shared_lock` (as `MetricsSink` does) append to the new one."""
    if not path.exists():
        return 0
    with _locked(path, fcntl.LOCK_EX):
        tmp, dropped = temp_sibling(path), 0
        try:
            with path.open(errors="replace") as old, tmp.open("w") as new:  # line by line: memory is one line
                for line in old:
                    try:
                        record = json.loads(line)
                        good = isinstance(record, dict) and line.endswith("\n") and keep(record)
                    except ValueError:
                        good = False
                    if good:
                        new.write(line)
                    else:
                        dropped += 1
                new.flush()
                os.fsync(new.fileno())
            if dropped:
                os.replace(tmp, path)
                _fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return dropped
