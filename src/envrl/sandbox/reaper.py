"""Records of live sandboxes, and the reaper that kills those whose owner is gone.

Guarantee: every started local sandbox has a record (its pid and start time, its owner's pid and
start time) in a run directory only this user can read or write (mode 0700, checked), written
before the sandbox runs any command and removed when it is closed. `reap()` SIGKILLs each
sandbox whose owner process is no longer alive (pid gone or reused: start times differ) and
removes its record; a record whose sandbox is gone is removed too. Killing a sandbox's
bubblewrap process kills its pid namespace's init and with it everything in the sandbox. The
sandboxes die with their owner anyway (bubblewrap's `--die-with-parent`); the reaper is the
second line for what survives that (a SIGKILLed env worker or env server) and runs on every
sandbox start at most every `REAP_INTERVAL_S`, and as `python -m envrl.sandbox.reaper`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from loguru import logger

RUN_DIR_ENV = "ENVRL_SANDBOX_RUN_DIR"
"""Overrides the run directory (tests give each test its own)."""
REAP_INTERVAL_S = 10.0
_last_reap = 0.0


def run_dir() -> Path:
    """The per-user directory of sandbox records, created 0700 and checked to be ours and private."""
    path = Path(os.environ.get(RUN_DIR_ENV) or Path(tempfile.gettempdir()) / f"envrl-sandboxes-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"sandbox run directory {path} must be a directory owned by uid {os.getuid()} with mode 0700 "
            f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); remove it or set {RUN_DIR_ENV}"
        )
    return path


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process, or it has
    exited and waits for its reaper: a zombie is gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


@dataclass(frozen=True)
class Record:
    pid: int
    start: int
    owner: int
    owner_start: int
    uid: int

    @property
    def path(self) -> Path:
        return run_dir() / f"{self.pid}-{self.start}.json"

    def owner_alive(self) -> bool:
        return start_time(self.owner) == self.owner_start

    def sandbox_alive(self) -> bool:
        return start_time(self.pid) == self.start


def register(pid: int, uid: int) -> Record | None:
    """Record a just-started sandbox owned by this process (None if it is already gone)."""
    start, owner_start = start_time(pid), start_time(os.getpid())
    if start is None or owner_start is None:
        return None
    record = Record(pid=pid, start=start, owner=os.getpid(), owner_start=owner_start, uid=uid)
    tmp = record.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.rename(record.path)
    return record


def unregister(record: Record | None) -> None:
    if record is not None:
        with contextlib.suppress(FileNotFoundError):
            record.path.unlink()


def reap() -> list[Record]:
    """Kill the sandboxes of dead owners and drop stale records; return the records of those killed."""
    killed: list[Record] = []
    for path in run_dir().glob("*.json"):
        try:
            record = Record(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if record.owner_alive():
            continue
        if record.sandbox_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)
            killed.append(record)
            logger.warning(f"reaped sandbox pid {record.pid} (uid {record.uid}): its owner pid {record.owner} is gone")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return killed


def reap_now_and_then() -> None:
    """`reap()`, at most every `REAP_INTERVAL_S` per process (called on each sandbox start)."""
    global _last_reap
    now = time.monotonic()
    if now - _last_reap >= REAP_INTERVAL_S:
        _last_reap = now
        reap()


def main() -> None:
    killed = reap()
    print(f"reaped {len(killed)} sandbox(es) in {run_dir()}")
    sys.exit(0)


if __name__ == "__main__":
    main()
