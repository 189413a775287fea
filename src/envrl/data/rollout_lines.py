"""Rollouts as JSON lines: `parse_trace_line(trace_line(trace, **fields))` gives back the fields (plus `outcome`)
and an equal Trace; a line that is not one raises `ValueError` saying why."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envrl.data.traces import Trace


def trace_line(trace: Trace, **fields: Any) -> str:
    """One line (newline included): `fields` (env name, step, ...) and the Trace's `outcome` first,
    then the Trace's keys."""
    clash = set(fields) & {*Trace.model_fields, "outcome"}
    if clash:
        raise ValueError(f"bookkeeping fields {sorted(clash)} would hide the Trace's own keys")
    return json.dumps({**fields, "outcome": trace.outcome, **trace.model_dump(mode="json")}) + "\n"


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append `lines` to `path` in one write (parent directories are created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("".join(lines))


def parse_trace_line(line: str) -> tuple[dict[str, Any], Trace]:
    """The bookkeeping fields and the Trace of one line written by `trace_line`."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    fields = {key: data.pop(key) for key in list(data) if key not in Trace.model_fields}
    try:
        return fields, Trace.model_validate(data, strict=False)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "<top level>"
        raise ValueError(f"not a Trace: {where}: {first['msg']}") from None
