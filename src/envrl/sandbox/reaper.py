"""Every sandbox claims its uid with a private record first; `kill_uid` SIGKILLs every process of a uid at once, and
`reap()` does it for each sandbox whose owner is gone (also `python -m envrl.sandbox.reaper`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from loguru import logger

from envrl.sandbox import bridge
from envrl.sandbox.user_dirs import owned_dir

RUN_DIR_ENV = "ENVRL_SANDBOX_RUN_DIR"
"""Overrides the run directory (tests give each test its own)."""
REAP_INTERVAL_S = 10.0
_last_reap = 0.0


def run_dir() -> Path:
    """The per-user directory of sandbox records, created 0700 and checked to be ours and private."""
    path = Path(os.environ.get(RUN_DIR_ENV) or Path(tempfile.gettempdir()) / f"envrl-sandboxes-{os.getuid()}")
    return owned_dir(path, 0o700, refuse=0o077, what="sandbox run directory", fix=f"remove it or set {RUN_DIR_ENV}")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process, or it has
    exited and waits for its reaper: a zombie is gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def as_uid(uid: int) -> list[str]:
    """The command prefix that runs the rest as host user and group `uid`, with no other group
    and no way to gain privileges (`setpriv`, so the caller still spawns with vfork: `Popen(user=)`
    forks the whole, possibly large, env worker)."""
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as host user `uid` (a sandbox's own), in one `kill(-1)`."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(  # the shell's own kill: procps is not on every minimal image
            [*as_uid(uid), "/bin/sh", "-c", "kill -9 -1"], env={}, timeout=10,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip


@dataclass(frozen=True)
class Record:
    uid: int
    owner: int
    owner_start: int

    @property
    def path(self) -> Path:
        return run_dir() / f"{self.uid}.json"

    def owner_alive(self) -> bool:
        return start_time(self.owner) == self.owner_start


def claim(uid: int) -> Record | None:
    """Claim `uid` for a sandbox owned by this process; None if a live sandbox already has it."""
    owner_start = start_time(os.getpid())
    assert owner_start is not None
    record = Record(uid=uid, owner=os.getpid(), owner_start=owner_start)
    try:
        fd = os.open(record.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(record)))
    return record


def release(record: Record | None) -> None:
    """Give a closed sandbox's uid back (after `kill_uid`: nothing runs as it any more)."""
    if record is not None:
        with contextlib.suppress(FileNotFoundError):
            record.path.unlink()


def reap() -> list[Record]:
    """Kill the sandboxes of dead owners and drop their records; return those records."""
    reaped: list[Record] = []
    for path in run_dir().glob("*.json"):
        try:
            record = Record(**json.loads(path.read_text()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if record.owner_alive():
            continue
        kill_uid(record.uid)
        bridge.remove(record.uid)
        reaped.append(record)
        logger.warning(f"reaped sandbox uid {record.uid}: its owner pid {record.owner} is gone")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return reaped


def reap_now_and_then() -> None:
    """`reap()`, at most every `REAP_INTERVAL_S` per process (called on each sandbox start)."""
    global _last_reap
    now = time.monotonic()
    if now - _last_reap >= REAP_INTERVAL_S:
        _last_reap = now
        reap()


def main() -> None:
    reaped = reap()
    print(f"reaped {len(reaped)} sandbox(es) in {run_dir()}")
    sys.exit(0)


if __name__ == "__main__":
    main()
