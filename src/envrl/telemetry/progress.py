"""The one progress display: every line given to `LiveLines` arrives whole and in order; a terminal keeps one
transient status line below them, anything else gets only the lines, byte for byte."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any, TextIO

CLEAR_LINE = "\r\033[K"


def fmt(value: float, spec: str = ".3f") -> str:
    """A metric for a progress line: `n/a` for NaN (nothing measured yet)."""
    return "n/a" if math.isnan(value) else format(value, spec)


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: short enough for a status column."""
    if math.isnan(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LiveLines:
    """A text stream with a status line under what is written to it. It is itself a stream, so a
    command on a terminal can route its log through it (`use_for_stderr`) and the status line
    never ends up in the middle of a log record."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self._status = ""
        self._shown = False
        self._line_start = True
        self._lock = threading.RLock()

    def line(self, text: str) -> None:
        self.write(text + "\n")

    def write(self, text: str) -> int:
        with self._lock:
            self._hide()
            self.stream.write(text)
            if text:
                self._line_start = text.endswith("\n")
            self._show()
        return len(text)

    def status(self, text: str) -> None:
        """Replace the status line (a no-op when not on a terminal)."""
        with self._lock:
            self._status = text if self.live else ""
            self._hide()
            self._show()

    def close(self) -> None:
        """Remove the status line; later writes go through as plain text."""
        with self._lock:
            self._status = ""
            self._hide()
            self.stream.flush()

    def use_for_stderr(self) -> None:
        """On a terminal, route `sys.stderr` (so a log sink set up after this) through these lines."""
        if self.live and self.stream is sys.stderr:
            sys.stderr = self  # type: ignore[assignment]

    def _hide(self) -> None:
        if self._shown:
            self.stream.write(CLEAR_LINE)
            self._shown = False

    def _show(self) -> None:
        if self._status and self._line_start:
            self.stream.write(self._status)
            self._shown = True
        self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.live

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ... of the stream underneath
        return getattr(self.stream, name)
