"""The stall watchdog: no step within max(`stall_min_s`, `stall_factor` x median step time) writes one dump per
stall (every role's stacks and waits, what the steps before waited for) to the log and `logs/stalls/`, and logs it as
a check; under `checks.strict` it cancels the run."""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from loguru import logger

from envrl.data.layout import stall_dump_file
from envrl.orchestrator.checks import CheckFailed
from envrl.orchestrator.policy import PolicyTracker
from envrl.orchestrator.scheduler import Group, Scheduler
from envrl.runtime.atomic import atomic_write_text
from envrl.runtime.stacks import collect_stacks, task_stacks, thread_stacks
from envrl.telemetry.advice import diagnose_run
from envrl.telemetry.metrics import MetricsSink

HISTORY = 50
"""Step times the median is taken over (the latest ones)."""


class StallWatchdog:
    """Fed `step_finished` by the loop; `check()` is the whole decision (the thread only calls it)."""

    def __init__(
        self,
        *,
        output_dir: Path,
        factor: float,
        min_s: float,
        strict: bool,
        describe: Callable[[], Iterable[str]],
        stacks_root: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        history: Iterable[float] = (),
        poll_s: float = 1.0,
        sink: MetricsSink | None = None,
    ) -> None:
        """`describe`: the orchestrator's lines for the dump (in-flight table, wait for the trainer);
        `stacks_root`: the pid whose envrl descendants are asked for their stacks (the launcher
        under `rl`; this process when run alone); `strict`: a stall cancels the task that called
        `start` (then `stalled` holds the dump); `sink`: where a stall is also logged as a check."""
        self.output_dir = output_dir
        self.factor, self.min_s, self.strict = factor, min_s, strict
        self.describe = describe
        self.stacks_root = stacks_root if stacks_root is not None else os.getpid()
        self.clock = clock
        self.durations: deque[float] = deque(history, maxlen=HISTORY)
        self.step = -1
        self.last = clock()
        self.dumped = False
        self.stalled: str | None = None
        """The dump of the stall that stopped the run (`strict`)."""
        self.poll_s = poll_s
        self.sink = sink
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def step_finished(self, step: int, seconds: float) -> None:
        self.durations.append(seconds)
        self.step, self.last, self.dumped = step, self.clock(), False

    def limit(self) -> float | None:
        """Seconds without a finished step that count as a stall (None: no step time known yet)."""
        if not self.durations:
            return None
        return max(self.min_s, self.factor * statistics.median(self.durations))

    def check(self) -> str | None:
        """The dump, if the run has stalled and this stall was not dumped yet."""
        limit = self.limit()
        waited = self.clock() - self.last
        if limit is None or self.dumped or waited <= limit:
            return None
        self.dumped = True
        return self.dump(waited, limit)

    def dump(self, waited: float, limit: float) -> str:
        median = statistics.median(self.durations)
        lines = [
            f"stall: no step finished in {waited:.0f} s since step {self.step} (limit {limit:.0f} s = max(stall_min_s, "
            f"{self.factor:g} x the median step time {median:.1f} s)); where every role is:",
            *self.describe(),
            "== what the steps before waited for (docs/report.md, What is my run waiting for?)",
            *(line for d in diagnose_run(self.output_dir) for line in d.lines()),
            *(task_stacks(self._loop) if self._loop is not None else []),
            f"== orchestrator (pid {os.getpid()}): Python stacks",
            thread_stacks(),
        ]
        for found in collect_stacks(self.stacks_root, skip=os.getpid()):
            lines += [f"== {found.role} (pid {found.pid}, stderr {found.log}): Python stacks", found.stacks]
        text = "\n".join(lines)
        path = stall_dump_file(self.output_dir, self.step + 1)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
        except OSError as e:
            logger.warning(f"stall: cannot write the dump to {path}: {e}")
        logger.error(
            f"{text}\nstall dump written to {path}; raise orchestrator.checks.stall_factor or stall_min_s "
            "if steps are legitimately this slow"
        )
        if self.sink is not None:  # after the dump: a sink closed under this thread must not cost it
            try:
                self.sink.log_check(self.step + 1, "stall", f"{lines[0]}; dump: {path}")
            except OSError as e:
                logger.warning(f"stall: cannot log the stall to {self.sink.path}: {e}")
        return text

    def start(self) -> None:
        """Watch from a thread of its own; call from the task a strict stall cancels."""
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._thread.start()

    def stopped_the_run(self) -> CheckFailed | None:
        """The error a stall that stopped the run (`strict`) ends it with; None: no stall did."""
        if self.stalled is None:
            return None
        return CheckFailed(f"stopped (orchestrator.checks.strict): {self.stalled.splitlines()[0]}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                text = self.check()
            except Exception as e:  # noqa: BLE001 - a watchdog that dies quietly is the silent hang it exists to end
                logger.opt(exception=e).error(f"stall watchdog: the check failed: {e}")
                continue
            if text is not None and self.strict and self._loop and self._task:
                self.stalled = text
                self._loop.call_soon_threadsafe(self._task.cancel, "stall (orchestrator.checks.strict)")
                return


def inflight_table(groups: Iterable[Group], now: float) -> list[str]:
    """The orchestrator's in-flight groups, oldest first, one line each."""
    rows = [
        f"  {g.env.name} task {g.task_idx} seed {g.seed}: {len(g.traces)} rollout(s) back, dispatched under policy "
        f"{g.policy_step} {now - g.dispatched:.0f} s ago"
        for g in groups
    ]
    return [f"== orchestrator: {len(rows)} group(s) in flight", *rows]


def loop_status(scheduler: Scheduler, policy: PolicyTracker) -> list[str]:
    """The orchestrator's part of a stall dump: its in-flight groups and its wait for the trainer."""
    return [
        *inflight_table(scheduler.inflight_groups(), time.time()),
        f"== orchestrator: serving policy {policy.current}; the trainer has published policy {policy.latest_published()} "
        f"(a step waits for the trainer while policy < step - max_async_level = step - {policy.max_async_level})",
    ]
