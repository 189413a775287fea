"""The time ledger as a Chrome trace file (Perfetto, chrome://tracing), a span nested only in one of its step and
rollout; each step's wall time split into parts is `telemetry/steps.py` (importable from here as before)."""

from __future__ import annotations

from typing import Any

from envrl.telemetry.ledger import LedgerSpan
from envrl.telemetry.steps import PARTS, TRAINING, StepSplit, env_times, step_splits

__all__ = ["PARTS", "TRAINING", "StepSplit", "chrome_trace", "env_times", "step_splits"]


def chrome_trace(spans: list[LedgerSpan]) -> dict[str, Any]:
    """The spans as Chrome trace events: one process (track) per ledger `process`, its spans on
    as few rows (threads) as keep them properly nested, a span nested only in one of the same
    step and extras (one rollout's phases in that rollout); times in microseconds from the first span."""
    events: list[dict[str, Any]] = []
    if not spans:
        return {"traceEvents": events, "displayTimeUnit": "ms"}
    origin = min(s.start for s in spans)
    for pid, process in enumerate(sorted({s.process for s in spans}), 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}})
        rows: list[list[LedgerSpan]] = []  # per row, the spans still open on it, outermost first
        for span in sorted((s for s in spans if s.process == process), key=lambda s: (s.start, -s.end)):
            row = next((i for i, ends in enumerate(rows) if _fits(ends, span)), None)
            if row is None:
                rows.append([])
                row = len(rows) - 1
            rows[row].append(span)
            args = {"step": span.step, **(span.model_extra or {})}
            events.append(
                {
                    "ph": "X",
                    "name": span.name,
                    "cat": process,
                    "pid": pid,
                    "tid": row + 1,
                    "args": args,
                    "ts": round((span.start - origin) * 1e6, 1),
                    "dur": round(max(span.duration, 0.0) * 1e6, 1),
                }  # fmt: skip
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _fits(open_spans: list[LedgerSpan], span: LedgerSpan) -> bool:
    """Close the spans of a row that ended before `span`; True if `span` nests in what stays open."""
    while open_spans and open_spans[-1].end <= span.start:
        open_spans.pop()
    if not open_spans:
        return True
    parent = open_spans[-1]
    same = parent.step == span.step and _identity(parent) == _identity(span) and parent.name != span.name
    return same and span.end <= parent.end


def _identity(span: LedgerSpan) -> dict[str, Any]:
    """The extras that say whose work a span is (env, rollout, task, ...): all but measurements
    (a rollout's seconds per tool)."""
    return {k: v for k, v in (span.model_extra or {}).items() if k != "tools"}
