"""Shared by the chaos scripts and their CI tests: run `rl` on the smoke config, find and kill its
processes, and account for every rollout from the run's own files.

Guarantee: `account(out)` counts from `rollouts/train.jsonl`, the orchestrator state published
with the newest batch and `metrics.jsonl` only, and its `lost` is dispatched rollouts minus those
that landed somewhere (a scored or error line in train.jsonl, requeued by a resume, or still
pending at the end), so lost = 0 means no rollout vanished. `RlRun` leaves no process of its run
behind, whatever happens to the caller (every descendant carries the run's marker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from statistics import fmean

from envrl.data.layout import curve_dir, published_steps, rollouts_root
from envrl.envclient.client import EnvClient, EnvServerError
from envrl.envclient.curve import curve_keys
from envrl.serve.config import CurveClientConfig
from envrl.telemetry.metrics import metric_float
from tests.support.ports import free_base_port, free_port
from tests.support.run_files import metric_lines

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "debug" / "cpu_smoke.toml"
MARKER = "ENVRL_CHAOS_RUN"
WORKER = "envrl.serve.worker"
"""A substring of every env worker's command line."""


def marked_pids(marker: str) -> list[int]:
    """Pids of the processes whose environment carries `MARKER=marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{MARKER}={marker}".encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def child_pids(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def _wait_busy(address: str, timeout: float, curve: CurveClientConfig) -> bool:
    """True once the env server at `address` reports a rollout in flight (False: not within `timeout`)."""
    deadline = time.monotonic() + timeout
    async with EnvClient(address, curve=curve) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.info(timeout=1.0)).in_flight > 0:
                    return True
            except EnvServerError:
                pass  # restarting, or busy being killed
            await asyncio.sleep(0.02)
    return False


def kill_random(pids: list[int], rng: random.Random) -> int | None:
    """SIGKILL one of `pids` at random; its pid, or None if there was none (or it had just exited)."""
    if not pids:
        return None
    pid = rng.choice(pids)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return pid


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RlRun:
    """One `rl` process on the smoke config in `out` (console in `<out>.console.log`), without the
    end-of-run report unless `report`."""

    def __init__(self, out: Path, *overrides: str, ports: tuple[int, int] | None = None, report: bool = False) -> None:
        self.out = out
        self.marker = uuid.uuid4().hex
        self.ports = ports or (free_port(), free_base_port())
        """(inference port, env server base port): pass them on to the resumed run."""
        self.console = out.parent / f"{out.name}.console.log"
        argv = [
            sys.executable, "-m", "envrl.launcher.main", "--config", str(SMOKE), "--output-dir", str(out),
            "--inference.port", str(self.ports[0]), "--env-server-base-port", str(self.ports[1]),
            *([] if report else ["--no-report"]), *overrides,
        ]  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, MARKER: self.marker, "WANDB_MODE": "disabled"}
        with self.console.open("ab") as console:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT)

    def __enter__(self) -> RlRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self, part: str) -> list[int]:
        """Live processes of this run whose command line contains `part`."""
        return [pid for pid in marked_pids(self.marker) if part in cmdline(pid)]

    def kill_one(self, part: str, rng: random.Random) -> int | None:
        """SIGKILL one random process whose command line contains `part`; its pid, or None."""
        return kill_random(self.pids(part), rng)

    def kill_busy_worker(self, rng: random.Random, timeout: float = 5.0) -> int | None:
        """SIGKILL a random worker of the train env server while it runs rollouts; its pid, or
        None if the server ran none within `timeout` (or had no worker to kill)."""
        curve = curve_keys(curve_dir(self.out))[1]  # rl's env servers serve only the run's key holder
        if not asyncio.run(_wait_busy(f"tcp://127.0.0.1:{self.ports[1]}", timeout, curve)):
            return None
        servers = self.pids("configs/envs/train/")
        return kill_random([pid for server in servers for pid in child_pids(server) if WORKER in cmdline(pid)], rng)

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float = 900.0, poll: float = 0.5) -> None:
        """Poll `done` until true; RuntimeError (with the console tail) if rl exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                raise RuntimeError(f"rl exited ({self.proc.returncode}) before {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:g} s:\n{self.tail()}")
            time.sleep(poll)

    def steps_done(self) -> int:
        """Batches the orchestrator has published so far (the newest step + 1: older batches may
        already be deleted by batch retention)."""
        steps = published_steps(rollouts_root(self.out))
        return steps[-1] + 1 if steps else 0

    def finish(self, timeout: float = 1800.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"rl did not finish within {timeout:g} s:\n{self.tail()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in marked_pids(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def tail(self, chars: int = 3000) -> str:
        return self.console.read_text(errors="replace")[-chars:] if self.console.exists() else ""


def resume(previous: RlRun, *overrides: str) -> RlRun:
    """`rl --resume` on the same output dir and ports."""
    return RlRun(previous.out, *overrides, "--resume", ports=previous.ports)


# -- accounting ----------------------------------------------------------------------------------


class TableRow:
    """A dataclass printed as one row of a markdown table (floats to `DIGITS` places)."""

    DIGITS = 3

    @classmethod
    def header(cls) -> str:
        names = [f.name for f in fields(cls)]
        return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)

    def line(self) -> str:
        cells = [f"{v:.{self.DIGITS}f}" if isinstance(v, float) else str(v) for v in asdict(self).values()]
        return "| " + " | ".join(cells) + " |"


@dataclass
class Row(TableRow):
    scenario: str
    faults: str
    steps: int
    """Steps the trainer completed (one metrics line each)."""
    dispatched: int
    """Rollout attempts: first dispatches plus re-runs."""
    scored: int
    """Lines in train.jsonl without an error (in a batch, or in a zero-variance group)."""
    retried: int
    """Attempts lost (dead server or worker, error) and run again."""
    errors: int
    """Lines in train.jsonl recorded as error traces (retries spent, stale)."""
    requeued: int
    """Rollouts pending when a run stopped, dispatched again by the resume."""
    pending: int
    """Rollouts in flight or unused when the last batch was published."""
    lost: int
    reward_first5: float
    reward_last5: float
    final_reward: float


def account(out: Path, scenario: str, faults: str) -> Row:
    """The row of the finished run in `out` (see the module docstring)."""
    steps = published_steps(rollouts_root(out))
    state = json.loads((out / "rollouts" / f"step_{steps[-1]}" / "orchestrator.json").read_text())
    counters, group_size = state["counters"], _group_size(out)
    lines = [json.loads(line) for line in (out / "rollouts" / "train.jsonl").read_text().splitlines()]
    errors = sum(line["error"] is not None for line in lines)
    metrics = metric_lines(out)
    rewards = [metric_float(m["train/reward"]) for m in sorted(metrics, key=lambda m: m["step"]) if "train/reward" in m]
    rewards = [r for r in rewards if not math.isnan(r)]  # a step whose rollouts all failed has none
    retried = counters.get("retried_rollouts", 0)
    requeued = counters.get("requeued_rollouts", 0)
    pending = len(state["pending"]) * group_size
    dispatched = counters.get("dispatched_rollouts", 0)
    refilled = counters.get("refilled_rollouts", 0)  # each a rollout line more: the failed attempt it replaced
    return Row(
        scenario=scenario,
        faults=faults,
        steps=sum("trainer/loss" in m for m in metrics),
        dispatched=dispatched + retried + refilled,
        scored=len(lines) - errors,
        retried=retried,
        errors=errors,
        requeued=requeued,
        pending=pending,
        lost=dispatched + refilled - len(lines) - requeued - pending,
        reward_first5=fmean(rewards[:5]) if rewards else float("nan"),
        reward_last5=fmean(rewards[-5:]) if rewards else float("nan"),
        final_reward=rewards[-1] if rewards else float("nan"),
    )


def _group_size(out: Path) -> int:
    text = (out / "configs" / "orchestrator.toml").read_text()
    return int(next(line.split("=")[1] for line in text.splitlines() if line.startswith("group_size")))


def check_unique_lines(out: Path) -> None:
    """AssertionError if a step is logged twice by one process, or train.jsonl has a step's rollouts twice."""
    metrics = metric_lines(out)
    keys = [
        (m["process"], m["step"], tuple(sorted(k for k in m if k not in ("step", "time", "process")))) for m in metrics
    ]
    duplicates = {k[:2] for k in keys if keys.count(k) > 1}
    assert not duplicates, f"metrics.jsonl logs these (process, step) twice: {sorted(duplicates)}"
    lines = [json.loads(line) for line in (out / "rollouts" / "train.jsonl").read_text().splitlines()]
    newest = published_steps(rollouts_root(out))[-1]
    assert max(line["step"] for line in lines) == newest, "train.jsonl has lines of a step with no batch"


def report(row: Row) -> None:
    print(Row.header())
    print(row.line(), flush=True)
