"""The step console: every step whose ending metrics line is written while it runs is printed exactly once, even
across a resume rewriting `metrics.jsonl`; it only reads the file; the ETA counts steady steps only."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from loguru import logger

from envrl.data.layout import metrics_file, steps_log_file
from envrl.telemetry.diagnosis import metrics_step, step_note
from envrl.telemetry.metrics import CHECK, metric_float
from envrl.telemetry.progress import LiveLines, duration, fmt

Record = dict[str, Any]

SINCE_SLACK_S = 1.0
"""Lines up to this much older than the console's start still count as this run's: metrics times
are rounded to the millisecond, and an earlier run's lines are minutes older (vLLM's start-up)."""


class MetricsTail:
    """New complete lines of a JSON-lines file since the last `read()`; starts over (from byte 0)
    when the bytes already read changed, as a resume's rewrite does. (An inode check is not enough:
    a replaced file's inode number is often reused at once.)"""

    SEEN_TAIL = 256
    """How many of the last bytes read are compared to tell an appended file from a rewritten one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._tail = b""
        self._partial = b""

    def read(self) -> list[Record]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset - len(self._tail))
                if f.read(len(self._tail)) != self._tail:
                    self._offset, self._tail, self._partial = 0, b"", b""
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        self._tail = (self._tail + data)[-self.SEEN_TAIL :]
        *lines, self._partial = (self._partial + data).split(b"\n")
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash; the writer's resume drops it
            if isinstance(record, dict):
                records.append(record)
        return records


def _per_env(record: Record, prefix: str, key: str) -> dict[str, float]:
    """`{env: value}` of the `<prefix>/<env>/<key>` entries of one metrics line."""
    out = {}
    for name, value in record.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == prefix and parts[2] == key:
            out[parts[1]] = metric_float(value)
    return out


FAILED_OUTCOMES = {"infra_error": "infra", "env_error": "env", "cancelled": "cancelled"}
"""The outcomes a step line names when any rollout had them, and their short names."""


def outcome_note(metrics: Mapping[str, Any]) -> str:
    """` (infra 2, env 1)`: the step's train rollouts that failed or were cancelled, by outcome,
    summed over the envs' `train/<env>/outcome/<outcome>` counts; empty when none did."""
    counts: Counter[str] = Counter()
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "train" and parts[2] == "outcome" and parts[3] in FAILED_OUTCOMES:
            count = metric_float(value)
            counts[FAILED_OUTCOMES[parts[3]]] += 0 if math.isnan(count) else int(count)
    named = [f"{name} {counts[name]}" for name in FAILED_OUTCOMES.values() if counts[name]]
    return f" ({', '.join(named)})" if named else ""


def fmt_shares(shares: Mapping[str, float]) -> str:
    """`a 75%, b 25%`: each env's share of a batch."""
    return ", ".join(f"{name} {share:.0%}" for name, share in shares.items())


SPLITS: dict[str, tuple[tuple[str, str], ...]] = {
    "trainer": (("wait batch", "trainer/wait_time_s"), ("train", "trainer/step_time_s"),
                ("publish", "trainer/publish_time_s")),
    "orchestrator": (("wait policy", "perf/wait_for_trainer"),),
}  # fmt: skip
"""Per process that ends a step: the parts of its step time its metrics line names."""


class ProgressBoard:
    """Turns metrics lines (trainer and orchestrator, in any order) into one text line per step.
    For `rl` (`ends_with="trainer"`) the trainer's line for step n ends step n, and the
    orchestrator's line for step n (the batch's rewards) is always written before it; for a
    standalone orchestrator (`ends_with="orchestrator"`) its own line ends the step."""

    def __init__(self, total_steps: int, since: float = 0.0, eta_window: int = 10, ends_with: str = "trainer") -> None:
        if ends_with not in SPLITS:
            raise ValueError(f"ends_with must be one of {sorted(SPLITS)}, not {ends_with!r}")
        self.total = total_steps
        self.since = since
        """Lines older than this (epoch seconds) belong to an earlier run and are not printed."""
        self.eta_window = eta_window
        self.ends_with = ends_with
        self._orchestrator: dict[int, Record] = {}
        self._evals: dict[str, tuple[int, float]] = {}
        self._printed: set[int] = set()
        self._checks: set[tuple[int, str, str]] = set()
        self._walls: list[float] = []
        """Wall times of the steady steps (every step after the first one seen)."""
        self._last_end: float | None = None

    def feed(self, record: Record) -> str | None:
        """The step line this record completes, or None."""
        step, process = record.get("step"), record.get("process")
        if not isinstance(step, int):
            return None
        if isinstance(record.get(CHECK), str):  # a check that fired: printed beside the step lines, once
            key = (step, record[CHECK], str(record.get("message")))
            if key in self._checks or metric_float(record.get("time")) < self.since:
                return None
            self._checks.add(key)
            return f"warning: {record.get('message')}"
        if process == "orchestrator":
            for env, reward in _per_env(record, "eval", "reward").items():
                self._evals[env] = (step, reward)
            if not any(k.startswith("train/") for k in record) or step in self._printed:
                return None  # a printed step's line, read again after a resume rewrote the file, is not kept
            self._orchestrator[step] = record
        if process != self.ends_with or step in self._printed or metric_float(record.get("time")) < self.since:
            return None
        self._printed.add(step)
        return self._line(step, record, self._orchestrator.pop(step, {}))

    def eta(self, now: float | None = None) -> float:
        """Seconds left, from the mean wall time of the last steady steps (NaN before there is one,
        unless no step is left)."""
        if not self._printed:
            return math.nan
        done = max(self._printed) + 1
        if done >= self.total:
            return 0.0
        if not self._walls:
            return math.nan
        recent = self._walls[-self.eta_window :]
        left = sum(recent) / len(recent) * max(self.total - done, 0)
        if now is not None and self._last_end is not None:
            left = max(left - (now - self._last_end), 0.0)
        return left

    def _wall(self, end_line: Record) -> float:
        """Wall time of this step: since the previous step's line, or (for the first one seen) the
        parts of the trainer's step (`rl`) or the orchestrator's own step time (standalone)."""
        end = metric_float(end_line.get("time"))
        if self._last_end is not None:
            wall = end - self._last_end
        elif self.ends_with == "trainer":
            wall = sum(metric_float(end_line.get(key)) for _, key in SPLITS["trainer"])
        else:
            wall = metric_float(end_line.get("perf/step_time"))
        self._last_end = end
        return wall

    def _lag(self, end_line: Record, orchestrator: Record) -> float:
        """Mean policy lag of the batch: the trainer's, or the mean of the orchestrator's per env."""
        if self.ends_with == "trainer":
            return metric_float(end_line.get("trainer/staleness_mean"))
        lags = [v for v in _per_env(orchestrator, "train", "staleness").values() if not math.isnan(v)]
        return sum(lags) / len(lags) if lags else math.nan

    def _line(self, step: int, end_line: Record, orchestrator: Record) -> str:
        steady = self._last_end is not None
        wall = self._wall(end_line)
        if steady and not math.isnan(wall):
            self._walls.append(wall)
        rewards = _per_env(orchestrator, "train", "reward")
        reward = ", ".join(f"{env} {fmt(r)}" for env, r in rewards.items()) or "n/a"
        evals = ", ".join(f"{env} {fmt(r)} @{at}" for env, (at, r) in self._evals.items()) or "none yet"
        gen = [v for v in _per_env(orchestrator, "train", "time_generation").values() if not math.isnan(v)]
        parts = [f"{name} {fmt(metric_float(end_line.get(key)), '.1f')}" for name, key in SPLITS[self.ends_with]]
        if gen:
            parts.append(f"gen {sum(gen) / len(gen):.1f}/rollout")
        errors = metric_float(orchestrator.get("train/error_rate"))
        inflight = orchestrator.get("inflight", "n/a")
        note = step_note(metrics_step(step, end_line, orchestrator, wall)) if self.ends_with == "trainer" else ""
        return (
            f"step {step} ({step + 1}/{self.total}) | reward {reward} | eval {evals} | "
            f"{fmt(wall, '.1f')} s ({', '.join(parts)}){f' | {note}' if note else ''} | in-flight {inflight} | "
            f"lag {fmt(self._lag(end_line, orchestrator), '.2f')} | "
            f"errors {fmt(errors * 100, '.0f')}%{outcome_note(orchestrator)} | ETA {duration(self.eta())}"
        )


class RunConsole:
    """Follows `<output_dir>/metrics.jsonl` in a thread and prints a line per step to `lines`
    (stderr by default), ended by the process `ends_with` names (see `ProgressBoard`)."""

    def __init__(
        self,
        output_dir: Path,
        total_steps: int,
        stream: TextIO | LiveLines | None = None,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        ends_with: str = "trainer",
    ) -> None:
        self.lines = stream if isinstance(stream, LiveLines) else LiveLines(stream)
        self.poll_s = poll_s
        self.clock = clock
        self.started = clock()
        self.tail = MetricsTail(metrics_file(output_dir))
        self.board = ProgressBoard(total_steps, since=self.started - SINCE_SLACK_S, ends_with=ends_with)
        self.steps_log = steps_log_file(output_dir)
        """Every step line also goes here (appended: a resumed run's lines follow the earlier ones)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.started = self.clock()
        self.board.since = self.started - SINCE_SLACK_S
        self._thread = threading.Thread(target=self._run, name="progress-console", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Print what is left in the file and end the thread (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.poll()
        self.lines.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as e:  # never let a display bug end or hide the run
                logger.warning(f"progress console: {e!r} reading {self.tail.path}; step lines stop here")
                return

    def poll(self) -> None:
        lines = []
        for record in self.tail.read():
            if (line := self.board.feed(record)) is not None:
                self.lines.line(line)
                lines.append(line)
        if lines:
            self.steps_log.parent.mkdir(parents=True, exist_ok=True)
            with self.steps_log.open("a") as f:
                f.write("".join(line + "\n" for line in lines))
        now = self.clock()
        self.lines.status(
            f"running {duration(now - self.started)} | ETA {duration(self.board.eta(now))} | {self.board.total} steps"
        )
