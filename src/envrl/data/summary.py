"""`summary.json`'s one home: written whole (strict JSON, a temp file and a rename) and read back; `read_summary`
never raises (a missing or malformed file reads as `{}`), so a run that died before its summary still gets a report."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from envrl.data.layout import summary_file


class Outcome(BaseModel):
    """How the run ended, as the launcher saw it."""

    status: Literal["success", "failed", "interrupted"]
    reason: str
    """`completed`, `process failed`, `SIGINT`/`SIGTERM` or the error that stopped the launcher."""
    failed_process: str | None = None
    exit_code: int | None = None
    """The failed process's exit code (negative: killed by that signal)."""
    failed_log: str | None = None
    """The failed process's log file (the report shows its last lines)."""
    error: str | None = None
    """The error's first line (a failed process's log tail is in its log file)."""

    @field_validator("error")
    @classmethod
    def _first_line(cls, error: str | None) -> str | None:
        return error.splitlines()[0] if error else error


class Stats(BaseModel):
    """First, last and best value of a per-step metric, with the step of each."""

    first: float | None
    last: float | None
    best: float | None
    best_step: int | None
    last_step: int | None


def read_summary(output_dir: Path) -> dict[str, Any]:
    """The run's `summary.json` as a dict, or `{}` when there is none or it is not a JSON object."""
    try:
        data = json.loads(summary_file(output_dir).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_summary(output_dir: Path, content: dict[str, Any]) -> Path:
    """Write `content` as the run's `summary.json` whole (temp file, then rename); returns its path."""
    path = summary_file(output_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(strict(content), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def strict(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
