"""Every `*.log` under the run's `logs/` is rotated past `max_mb` keeping `keep` copies, in place (writers never
reopen), never through a symlink at any component of its path."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from pathlib import Path

from loguru import logger
from pydantic import Field

from envrl.config import BaseConfig

CHECK_INTERVAL_S = 10.0
"""Seconds between two looks at the log sizes."""


class LogRotationConfig(BaseConfig):
    max_mb: float = Field(100.0, gt=0)
    """A process's log file is rotated when it passes this size (MiB)."""
    keep: int = Field(3, ge=1)
    """Rotated copies kept per log file (`x.log.1` newest); older ones are deleted."""


MAX_DEPTH = 8
"""Directory levels under `logs/` that rotation enters (the run's own logs are at most three deep)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def rotate_if_large(path: Path, config: LogRotationConfig, root: Path | None = None) -> bool:
    """Rotate `path` if it is a regular file holding more than `config.max_mb` MiB; returns
    whether it did. Reached from `root` (default: its directory) one component at a time, each
    opened without following a symlink, so a directory on the way swapped for a link to one envrl
    did not write is never entered."""
    root = path.parent if root is None else root
    *dirs, name = path.relative_to(root).parts
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return False
    try:
        for part in dirs:
            parent, fd = fd, -1
            try:
                fd = os.open(part, _DIR_FLAGS, dir_fd=parent)
            finally:
                os.close(parent)
        return _rotate_in(fd, name, config)
    except OSError:  # gone, a symlink (ELOOP), or not ours to write
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _rotate_in(dir_fd: int, name: str, config: LogRotationConfig) -> bool:
    """`rotate_if_large` for file `name` of the open directory `dir_fd`: opened without following
    a symlink, copied (with its own mode) and truncated through that one descriptor."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:  # gone, a symlink (ELOOP), or not ours to write
        return False
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= config.max_mb * 1024**2:
            return False
        for i in range(config.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{name}.{i}", f"{name}.{i + 1}", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        newest = f"{name}.1"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(newest, dir_fd=dir_fd)  # a link planted there is removed, never written through
        mode = stat.S_IMODE(info.st_mode)
        copy = os.open(newest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
        os.fchmod(copy, mode)  # the umask does not widen or narrow what the source allowed
        with os.fdopen(copy, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024**2)
        os.ftruncate(fd, 0)
    return True


def rotate_logs(logs_dir: Path, config: LogRotationConfig) -> list[Path]:
    """Rotate every `*.log` under `logs_dir` (env server logs included) that is over the limit.
    Every directory is opened from its parent's descriptor without following a symlink (a
    directory swapped for a link while the walk runs is not entered), at most `MAX_DEPTH` deep."""
    try:
        stack = [(os.open(logs_dir, _DIR_FLAGS), logs_dir, 0)]
    except OSError:
        return []
    rotated = []
    while stack:
        fd, path, depth = stack.pop()
        try:
            with os.scandir(fd) as entries:
                listed = sorted(entries, key=lambda entry: entry.name)
            for entry in listed:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH:
                        with contextlib.suppress(OSError):
                            stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), path / entry.name, depth + 1))
                elif entry.name.endswith(".log") and _rotate_in(fd, entry.name, config):
                    rotated.append(path / entry.name)
        finally:
            os.close(fd)
    return sorted(rotated)


class LogRotator:
    """A daemon thread that rotates the run's logs every `CHECK_INTERVAL_S` until `stop()`."""

    def __init__(self, logs_dir: Path, config: LogRotationConfig, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.logs_dir = logs_dir
        self.config = config
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="log-rotation", daemon=True)

    def start(self) -> LogRotator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def run(self) -> None:
        """Rotate every `interval_s` until `stop()` (in the calling thread; `start` runs it in its own)."""
        while not self._stop.wait(self.interval_s):
            try:
                for path in rotate_logs(self.logs_dir, self.config):
                    logger.info(f"rotated {path} (over {self.config.max_mb:g} MiB; {self.config.keep} kept)")
            except OSError as e:  # a full disk or a vanished dir must not end the run
                logger.warning(f"log rotation under {self.logs_dir} failed: {e}")


def main(argv: list[str] | None = None) -> None:
    """Rotate a run's logs until stopped: `rl --slurm`'s job runs this beside its steps."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m envrl.launcher.log_rotation", description=main.__doc__)
    parser.add_argument("--logs-dir", type=Path, required=True)
    parser.add_argument("--max-mb", type=float, default=LogRotationConfig().max_mb)
    parser.add_argument("--keep", type=int, default=LogRotationConfig().keep)
    args = parser.parse_args(argv)
    LogRotator(args.logs_dir, LogRotationConfig(max_mb=args.max_mb, keep=args.keep)).run()


if __name__ == "__main__":
    main()
