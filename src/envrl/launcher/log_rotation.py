"""Keeping a week-long run's logs bounded: every `*.log` under the run's `logs/` is rotated when it
passes `max_mb`, keeping `keep` older copies (`x.log.1` newest ... `x.log.<keep>`).

Guarantee: at most `(keep + 1) * max_mb` (plus what is written between two looks) per log file.
Rotation copies the file, then truncates it in place: every writer (a child's stdout, loguru's
file sink, vLLM's C-level prints) appends with O_APPEND, so it goes on writing at the new end of
the same file and no process needs to reopen anything. A line written between the copy and the
truncation is lost; that window is one `ftruncate` call. Nothing is read, written or truncated
through a symlink: code running as the run's user cannot turn rotation against another file.
"""

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


def rotate_if_large(path: Path, config: LogRotationConfig) -> bool:
    """Rotate `path` if it is a regular file holding more than `config.max_mb` MiB; returns
    whether it did. It is opened without following a symlink (one could point at a file envrl
    did not write), and copied and truncated through that one descriptor."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone, a symlink (ELOOP), or not ours to write
        return False
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= config.max_mb * 1024**2:
            return False
        for i in range(config.keep - 1, 0, -1):
            older = path.with_name(f"{path.name}.{i}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
        newest = path.with_name(f"{path.name}.1")
        with contextlib.suppress(FileNotFoundError):
            newest.unlink()  # a link planted there is removed, never written through
        with os.fdopen(os.open(newest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as dst:
            shutil.copyfileobj(src, dst, 1024**2)
        os.ftruncate(fd, 0)
    return True


def rotate_logs(logs_dir: Path, config: LogRotationConfig) -> list[Path]:
    """Rotate every `*.log` under `logs_dir` (env server logs included) that is over the limit;
    symlinked directories are not entered."""
    logs = [
        Path(root) / name
        for root, _, files in os.walk(logs_dir, followlinks=False)
        for name in files
        if name.endswith(".log")
    ]
    return [path for path in sorted(logs) if rotate_if_large(path, config)]


class LogRotator:
    """A daemon thread that rotates the run's logs every `CHECK_INTERVAL_S` until `stop()`."""

    def __init__(self, logs_dir: Path, config: LogRotationConfig, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.logs_dir = logs_dir
        self.config = config
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-rotation", daemon=True)

    def start(self) -> LogRotator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for path in rotate_logs(self.logs_dir, self.config):
                    logger.info(f"rotated {path} (over {self.config.max_mb:g} MiB; {self.config.keep} kept)")
            except OSError as e:  # a full disk or a vanished dir must not end the run
                logger.warning(f"log rotation under {self.logs_dir} failed: {e}")
