"""The time ledger: each span is one JSON line with wall-clock times, each writer appending only to its own file; a
reader skips cut lines and keeps per step only the last run's spans, so a redone step counts once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel, ConfigDict, ValidationError

from envrl.data.layout import ledger_dir, ledger_file

FLUSH_EVERY = 2000
"""Buffered spans that force a write before the step's own `flush()` (bounds the memory of a long step)."""


class LedgerSpan(BaseModel):
    """One timed piece of work; extra keys (an env, a rollout) ride along."""

    model_config = ConfigDict(extra="allow")

    process: str
    """The track that did the work: `orchestrator`, `trainer`, `inference`, `env <name>`."""
    name: str
    step: int
    """The training step the work is for (a rollout: the batch it landed in)."""
    start: float
    end: float
    run: float
    """When the writer was opened: tells a resumed process's spans from the crashed one's."""

    @property
    def duration(self) -> float:
        return self.end - self.start


class Ledger:
    """Appends the spans of one process to its ledger file; a ledger without a path records nothing
    (a trainer rank other than the main one, a component built without one in a test)."""

    def __init__(self, path: Path | None, process: str) -> None:
        self.path = path
        self.process = process
        self.run = time.time()
        self._lines: list[str] = []

    @classmethod
    def of(cls, output_dir: Path, process: str) -> Ledger:
        """The ledger of `process` in the run dir `output_dir`."""
        return cls(ledger_file(output_dir, process), process)

    @contextmanager
    def span(self, name: str, step: int, *, process: str | None = None, **extra: Any) -> Iterator[None]:
        """Record the `with` block as span `name` of `step` (also when it raises or is cancelled)."""
        start = time.time()
        try:
            yield
        finally:
            self.record(name, step, start, time.time(), process=process, **extra)

    def record(
        self, name: str, step: int, start: float, end: float, *, process: str | None = None, **extra: Any
    ) -> None:
        """Record a span measured elsewhere (a rollout's timing, read from its Trace)."""
        if self.path is None:
            return
        span = {"process": process or self.process, "name": name, "step": step, "start": start, "end": end}
        self._lines.append(json.dumps({**span, "run": self.run, **extra}) + "\n")
        if len(self._lines) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Append the buffered spans in one write; a line a crash cut short is ended first, so the
        cut line is all that is lost."""
        if self.path is None or not self._lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab+") as f:
            ended = True
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                ended = f.read(1) == b"\n"
            f.write(("" if ended else "\n").encode() + "".join(self._lines).encode())
        self._lines.clear()

    def close(self) -> None:
        self.flush()


def read_ledger_file(path: Path) -> list[LedgerSpan]:
    """The spans of one writer's file: cut lines skipped, each step's spans from its last run only."""
    spans = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            spans.append(LedgerSpan.model_validate_json(line))
        except ValidationError:
            logger.warning(f"{path}:{number}: not a ledger span (cut by a crash?); skipped")
    last = {span.step: span.run for span in spans}  # file order: a resumed writer appends after
    return [span for span in spans if span.run == last[span.step]]


def read_ledger(output_dir: Path) -> list[LedgerSpan]:
    """Every writer's spans in the run dir `output_dir`, ordered by start."""
    spans = [span for path in sorted(ledger_dir(output_dir).glob("*.jsonl")) for span in read_ledger_file(path)]
    return sorted(spans, key=lambda span: span.start)
