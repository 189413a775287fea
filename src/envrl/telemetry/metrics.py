"""`metrics.jsonl`'s one home: each `log(step, values)` appends one JSON line in one `write` (processes share the
file safely), wandb gets the same, `resume_step=k` first drops the process's lines from step k; `read_metrics` reads."""

from __future__ import annotations

import errno
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from loguru import logger

from envrl.config import BaseConfig
from envrl.data.layout import metrics_file
from envrl.runtime.atomic import filter_lines, shared_lock

if TYPE_CHECKING:
    from envrl.data.traces import Trace

Record = dict[str, Any]
"""One line of `metrics.jsonl` as read back."""

CHECK = "check"
"""The key that marks a check's line (`log_check`) among the metric lines."""

SAMPLE_ROWS = 8
"""Rollouts per eval in the wandb table of samples."""
SAMPLE_CHARS = 2000
"""Characters kept of each prompt and completion in that table (a table cell is not a log)."""


class WandbConfig(BaseConfig):
    FLAG: ClassVar[tuple[str, str]] = ("mode", "online")
    """A bare `--wandb` on the command line means `--wandb.mode online` (as prime-rl's `--wandb`)."""

    mode: Literal["online", "offline", "disabled"] = "disabled"
    """Off unless asked for (`--wandb`); `offline` writes runs under `dir` for a later `wandb sync`;
    `online` needs a wandb login."""
    project: str = "envrl"
    """wandb project name."""
    group: str | None = None
    """wandb group tying the processes of one run together (default: the output dir's name)."""
    name: str | None = None
    """wandb run name (default: `<group>-<process>`)."""
    dir: Path | None = None
    """Where wandb keeps its files (default: the output dir)."""


def _json_value(value: Any) -> Any:
    """Non-finite floats as strings, since JSON has no NaN; everything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def metric_float(value: Any) -> float:
    """A value read back from `metrics.jsonl` as a float: NaN for what is missing, not a number,
    or written as a string because JSON has no NaN (`"nan"`, `"inf"` come back as floats)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class MetricsSink:
    """Appends metric lines to `path` and mirrors them to wandb; call `close()` at the end."""

    def __init__(
        self,
        path: Path,
        wandb: WandbConfig,
        *,
        process: str,
        output_dir: Path,
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.process = process
        if resume_step is not None:
            dropped = filter_lines(path, lambda r: r.get("process") != process or r.get("step", -1) < resume_step)
            if dropped:
                logger.info(
                    f"{path}: dropped {dropped} {process} line(s) of steps >= {resume_step} (logged again after the resume)"
                )
        self._fd = self._open()
        self._lock = threading.Lock()  # a check may be logged from the stall watchdog's thread
        self._run = None
        if wandb.mode != "disabled":
            import wandb as wandb_lib  # imported here: it costs a second and only some runs want it

            group = wandb.group or Path(output_dir).resolve().name
            wandb_dir = wandb.dir or Path(output_dir)
            wandb_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb_lib.init(
                project=wandb.project,
                group=group,
                name=wandb.name or f"{group}-{process}",
                dir=str(wandb_dir),
                mode=wandb.mode,
                config=config,
                job_type=process,
            )
            logger.info(f"wandb run {self._run.name!r} ({wandb.mode}) under {wandb_dir}")

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, step: int, values: dict[str, float | int | str]) -> None:
        self._append({"step": step, **{k: _json_value(v) for k, v in values.items()}})
        if self._run is not None:
            self._run.log(dict(values), step=step)

    def log_check(self, step: int, check: str, message: str) -> None:
        """A check that fired at `step` (`check`: its name, `message`: the cause and the fix), as a
        line of its own that the console prints and `checks_fired` reads back; not sent to wandb."""
        self._append({"step": step, CHECK: check, "message": message})

    def _append(self, values: dict[str, Any]) -> None:
        record = {"step": values["step"], "time": round(time.time(), 3), "process": self.process, **values}
        with self._lock, shared_lock(self.path):
            if self._fd < 0:
                raise OSError(errno.EBADF, "the metrics sink is closed", str(self.path))
            if not self.path.exists() or os.stat(self.path).st_ino != os.fstat(self._fd).st_ino:
                os.close(self._fd)  # another process's resume rewrote the file: append to the new one
                self._fd = self._open()
            line = (json.dumps(record) + "\n").encode()
            try:
                if os.write(self._fd, line) < len(line):  # a short write: the disk filled up under it
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(self._fd)  # on disk before the step it belongs to is published
            except OSError as e:
                raise OSError(e.errno, f"{e.strerror} (appending a metrics line)", str(self.path)) from e

    def log_samples(self, step: int, name: str, traces: list[Trace]) -> None:
        """A wandb table `name` of the first `SAMPLE_ROWS` rollouts (prompt, completion, reward,
        stop reason, error) at `step`; nothing when wandb is off (the rollouts are in their JSONL)."""
        if self._run is None:
            return
        import wandb as wandb_lib

        rows = []
        for trace in traces[:SAMPLE_ROWS]:
            turn = trace.branches[0].turns[-1] if trace.branches and trace.branches[0].turns else None
            prompt = str(turn.prompt[-1].get("content", "")) if turn and turn.prompt else ""
            completion = str(turn.response.get("content", "")) if turn else ""
            error = trace.error.type if trace.error else ""
            rows.append([prompt[-SAMPLE_CHARS:], completion[:SAMPLE_CHARS], trace.reward, trace.stop_reason, error])
        columns = ["prompt", "completion", "reward", "stop_reason", "error"]
        self._run.log({name: wandb_lib.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        """Finish the wandb run and close the file; a wandb run that cannot be finished (a full
        disk) is logged, not raised, so it never hides the error that ended the process."""
        if self._run is not None:
            run, self._run = self._run, None
            try:
                run.finish()
            except OSError as e:
                logger.warning(f"wandb run {run.name!r} could not be finished ({e}); {self.path} is complete")
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_metrics(output_dir: Path) -> list[Record]:
    """Every complete metrics line of the run, in file order."""
    path = metrics_file(output_dir)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            logger.warning(f"{path}:{number}: not a JSON line (cut by a crash?); skipped")
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def series(records: list[Record], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of `key`, the last line winning when a step was logged twice."""
    by_step = {r["step"]: metric_float(r[key]) for r in records if key in r}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def env_names(records: list[Record], prefix: str) -> list[str]:
    """Env names appearing as `<prefix>/<env>/reward` keys, sorted."""
    return sorted({k.split("/")[1] for r in records for k in r if k.startswith(f"{prefix}/") and k.count("/") == 2})


def checks_fired(records: list[Record]) -> list[dict[str, Any]]:
    """The checks that fired (`log_check`), in file order: `step`, `process`, `check`, `message`."""
    return [
        {key: r.get(key) for key in ("step", "process", CHECK, "message")}
        for r in records
        if isinstance(r.get(CHECK), str)
    ]
