"""Publishing directories atomically on a shared filesystem.

Guarantee: a directory published through `atomic_dir` appears under its final name only after
every file in it is written and fsynced; the rename is the completion marker, so a reader that
sees `step_<n>/` never sees half of it, and a crash leaves only a hidden `.tmp` sibling behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (and `root` itself) to disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
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


def atomic_write_text(path: Path, text: str) -> None:
    """Replace the file `path` with `text` so that readers see the old or the new content, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
