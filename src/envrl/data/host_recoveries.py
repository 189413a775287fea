"""Each host of an `rl --slurm` job publishes its supervisor's recoveries whole, and the failure that ended its
slice (`slurm/recoveries/host<i>.json`, its user's only, replaced in one rename); `gather` and `failure` read
every host's for `summary.json` (docs/scale.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel, ValidationError

from envrl.data.layout import host_recoveries_dir, host_recoveries_file
from envrl.data.summary import Outcome
from envrl.runtime.atomic import atomic_write_text


class FaultRecord(BaseModel):
    """One death of a restarted process (`Supervisor.recoveries`' `faults`)."""

    exit: str
    seconds_lost: float
    back: bool


class Recovery(BaseModel):
    """One restarted process's recoveries (`Supervisor.recoveries`' entry)."""

    restarts: int
    seconds_lost: float
    faults: list[FaultRecord]

    def later(self, seconds: float) -> Recovery:
        """As counted `seconds` after it was: an open fault (the last one, not back) has lost that much more."""
        if not self.faults or self.faults[-1].back or seconds <= 0:
            return self
        *closed, last = self.faults
        faults = [*closed, last.model_copy(update={"seconds_lost": last.seconds_lost + seconds})]
        return self.model_copy(update={"seconds_lost": self.seconds_lost + seconds, "faults": faults})


class HostRecoveries(BaseModel):
    """What one host's file holds: its recoveries as counted at `written_at` (seconds since the epoch)."""

    host: int
    written_at: float
    recoveries: dict[str, Recovery]
    failure: Outcome | None = None
    """The host's outcome when a process failed past its restarts, which ended its slice and the job."""


def write(output_dir: Path, host: int, recoveries: dict[str, dict[str, Any]], failure: Outcome | None = None) -> None:
    """Replace host `host`'s file with its `recoveries` (`Supervisor.recoveries`) as of now and the
    `failure` that ended its slice, if one did."""
    snapshot = HostRecoveries(host=host, written_at=time.time(), recoveries=recoveries, failure=failure)
    atomic_write_text(host_recoveries_file(output_dir, host), snapshot.model_dump_json(indent=1), private=True)


def clear(output_dir: Path) -> None:
    """Remove every host's file (only those: anything else in the directory is left), so a new
    job's hosts start with none restarted."""
    for path in host_recoveries_dir(output_dir).glob("host*.json"):
        if path.is_file() and not path.is_symlink():
            path.unlink()


def gather(output_dir: Path, host: int, recoveries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every host's recoveries by process name, each entry with its `host`: host `host`'s own
    `recoveries` and every other host's last file, its open faults counted to now as `host`'s are."""
    now = time.time()
    snapshots = [HostRecoveries(host=host, written_at=now, recoveries=recoveries)]
    for path in sorted(host_recoveries_dir(output_dir).glob("host*.json")):
        if path != host_recoveries_file(output_dir, host):
            snapshots += _read(path)
    return {
        name: {**recovery.later(now - snapshot.written_at).model_dump(), "host": snapshot.host}
        for snapshot in sorted(snapshots, key=lambda snapshot: snapshot.host)
        for name, recovery in snapshot.recoveries.items()
    }


def failure(output_dir: Path) -> Outcome | None:
    """The failure that ended the job: the one the lowest-numbered failed host published, or None."""
    snapshots = [
        snapshot for path in sorted(host_recoveries_dir(output_dir).glob("host*.json")) for snapshot in _read(path)
    ]
    failed = sorted((snapshot.host, snapshot.failure) for snapshot in snapshots if snapshot.failure is not None)
    return failed[0][1] if failed else None


def _read(path: Path) -> list[HostRecoveries]:
    """The file at `path`, or none when it cannot be read (said in the log: the summary goes on without it)."""
    try:
        return [HostRecoveries.model_validate_json(path.read_text())]
    except (OSError, ValidationError) as e:
        logger.warning(
            f"{path}: not read ({type(e).__name__}: {str(e).splitlines()[0]}); its host's restarts are not in summary.json"
        )
        return []
