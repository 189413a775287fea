"""`eval`'s progress (done / total per env, rate, errors, mean reward, ETA): the grid's last rollout always prints a
final line; between, a live status line on a terminal, at most one line per `interval` seconds on a pipe."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from statistics import fmean

from envrl.data.traces import Trace
from envrl.telemetry.progress import LiveLines, duration, fmt

PROGRESS_INTERVAL = 5.0
"""Seconds between progress lines when not on a terminal (the first and the last rollout always print one)."""


class EvalProgress:
    """Rollouts done / total per env, rate, errors, running mean reward and ETA: a status line on a
    terminal, else a line at most every `interval` seconds (and for the first and last rollouts)."""

    def __init__(
        self,
        totals: dict[str, int],
        lines: LiveLines,
        interval: float = PROGRESS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.totals = totals
        self.lines = lines
        self.interval = interval
        self.clock = clock
        self.done: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.rewards: dict[str, list[float]] = {env: [] for env in totals}
        self.started = self.last_line = clock()

    def add(self, env: str, traces: list[Trace]) -> None:
        first = not self.done
        self.done[env] += len(traces)
        self.errors[env] += sum(t.has_error for t in traces)
        self.rewards[env].extend(t.reward for t in traces if not t.has_error and t.reward is not None)
        now = self.clock()
        text = self.line(now)
        if self.total_done() >= sum(self.totals.values()):
            self.lines.close()
            self.lines.line(text)
        elif self.lines.live:
            self.lines.status(text)
        elif first or now - self.last_line >= self.interval:
            self.last_line = now
            self.lines.line(text)

    def total_done(self) -> int:
        return sum(self.done.values())

    def line(self, now: float) -> str:
        done, total = self.total_done(), sum(self.totals.values())
        rate = done / max(now - self.started, 1e-9)
        eta = (total - done) / rate if rate > 0 else math.nan
        per_env = " | ".join(
            f"{env} {self.done[env]}/{n} reward {fmt(fmean(self.rewards[env]) if self.rewards[env] else math.nan)} "
            f"errors {self.errors[env]}"
            for env, n in self.totals.items()
        )
        return (
            f"rollouts {done}/{total} ({done / max(total, 1):.0%}) | {rate:.2f} rollouts/s | "
            f"errors {sum(self.errors.values())} | ETA {duration(eta)} | {per_env}"
        )
