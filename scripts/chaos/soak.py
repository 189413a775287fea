"""Chaos soak: the smoke run for many steps while a random role is SIGKILLed every 20-40 s.

    uv run --no-sync python -m scripts.chaos.soak [--steps 300] [--gap 20 40] [--seed 0] [--out DIR]

Roles: an env worker (busy), the train env server, the inference server, the trainer, the
orchestrator. Nobody types `--resume`: `rl` must bring every role back by itself. At the end it
checks that the run finished by itself (exit 0), that every step was trained and reported once,
that every group drawn landed once (replayed from the seeded sampler), and that no process of the run is left; then it prints
the fault table (fault, count, seconds lost, rollouts re-run), the accounting row of
tests/support/chaos_runs.py and the RSS of each long-lived role after warm-up, at half way and at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from envrl.data.layout import published_steps, rollouts_root
from envrl.envclient.handles import TrainEnvs
from tests.support.chaos_runs import SMOKE, WORKER, RlRun, TableRow, account, check_unique_lines, cmdline, report
from tests.support.run_files import metric_lines
from tests.support.smoke import wait_no_survivors

ROLES = {
    "inference": "envrl.inference.main",
    "trainer": "envrl.trainer.main",
    "orchestrator": "envrl.orchestrator.main",
    "env server": "configs/envs/",
}
"""Long-lived roles by a substring of their command line (an env worker runs under its server)."""
FAULTS = ("env worker", "env server", "inference", "trainer", "orchestrator")
SUMMARY_NAMES = {"inference": "inference", "trainer": "trainer", "orchestrator": "orchestrator"}
"""Fault -> the process name `summary.json`'s recoveries use (env servers: matched by prefix)."""
BUDGET = {"max_restarts": 1000, "max_backoff_s": 2}
"""Restarts no soak spends: the kills are the test, not the budget."""


@dataclass
class FaultRow(TableRow):
    fault: str
    count: int
    seconds_lost: float
    """Death to back again, summed (`summary.json` recoveries; env workers: not measured)."""
    rollouts_rerun: int
    """Retried and requeued rollouts counted between this kind's kills and the next kill."""


@dataclass
class RssRow(TableRow):
    role: str
    warm_mib: float
    """After `--warmup` steps, before the first kill."""
    mid_mib: float
    """At half the steps (restarts done before then have warmed their caches too)."""
    end_mib: float
    """A few steps before the end."""
    change_mid_to_end: float


def overrides(steps: int) -> list[str]:
    """The smoke config for `steps` steps with budgets no soak spends (the kills are the test)."""
    argv = ["--max-steps", str(steps)]  # the env servers follow the run's `restarts` too
    argv += [item for key, value in BUDGET.items() for item in (f"--restarts.{key}", str(value))]
    return argv


def rss_mib(pid: int, descendants: bool = True) -> float:
    """Resident memory of `pid` (and all its descendants), in MiB."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            if descendants:
                for task in Path(f"/proc/{current}/task").iterdir():
                    stack += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


def memory(run: RlRun) -> dict[str, float]:
    """RSS of each long-lived role now: rl itself, then each role with what it started (vLLM's
    engine core, an env server's workers)."""
    out = {"launcher (rl alone)": rss_mib(run.proc.pid, descendants=False)}
    for role, part in ROLES.items():
        out[role] = sum(rss_mib(pid) for pid in run.pids(part) if WORKER not in cmdline(pid))
    return out


def rerun_counter(out: Path) -> int:
    """Retried plus requeued rollouts, from the state published with the newest batch."""
    steps = published_steps(rollouts_root(out))
    if not steps:
        return 0
    try:
        counters = json.loads((out / "rollouts" / f"step_{steps[-1]}" / "orchestrator.json").read_text())["counters"]
    except (OSError, ValueError):
        return 0
    return counters.get("retried_rollouts", 0) + counters.get("requeued_rollouts", 0)


def kill(run: RlRun, fault: str, rng: random.Random) -> int | None:
    if fault == "env worker":
        return run.kill_busy_worker(rng, timeout=5.0)
    if fault == "env server":
        return run.kill_one("configs/envs/train/", rng)
    return run.kill_one(ROLES[fault], rng)


def group_tasks(out: Path, group_size: int) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    """(env, task) of every group the run drew, replayed from the seeded sampler up to the final
    state's positions, and of every group it accounted for: written to train.jsonl (a group's
    lines are consecutive) or pending in that state. A group that landed twice shows as a task
    counted more often than it was drawn."""
    steps = published_steps(rollouts_root(out))
    state = json.loads((out / "rollouts" / f"step_{steps[-1]}" / "orchestrator.json").read_text())
    config = tomllib.loads((out / "configs" / "orchestrator.toml").read_text())
    sizes = {env.get("name") or env["id"]: env["args"]["num_train"] for env in config["envs"]}
    sampler = TrainEnvs([], config.get("seed", 0))
    drawn: Counter[tuple[str, int]] = Counter()
    for name, position in state["positions"].items():
        env = SimpleNamespace(name=name, num_tasks=sizes[name])
        sampler.positions[name] = 0
        drawn.update((name, sampler.next_task(env)) for _ in range(position))  # type: ignore[arg-type]
    lines = [json.loads(line) for line in (out / "rollouts" / "train.jsonl").read_text().splitlines()]
    landed = Counter((line["env"], line["task"]["idx"]) for line in lines[::group_size])
    landed.update((group["env"], group["task_idx"]) for group in state["pending"])
    return drawn, landed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--gap", type=float, nargs=2, default=(20.0, 40.0), help="seconds between kills: min max")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the first kill (and the first RSS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / "soak"
    rng = random.Random(args.seed)
    kills: list[tuple[str, int]] = []
    """(fault, re-run counter at the kill)."""
    started = time.monotonic()
    with RlRun(out, *overrides(args.steps)) as run:
        run.wait_until(f"batch {args.warmup}", lambda: run.steps_done() >= args.warmup, timeout=1800)
        warm = memory(run)
        mid = end = warm
        next_kill = time.monotonic() + rng.uniform(*args.gap)
        while run.proc.poll() is None:
            if run.steps_done() < args.steps - 1:
                mid = memory(run) if run.steps_done() <= args.steps // 2 else mid
                end = memory(run) if run.steps_done() >= args.steps - 5 else end
            if time.monotonic() >= next_kill and run.steps_done() < args.steps - 1:
                fault = rng.choice(FAULTS)
                counter = rerun_counter(out)
                pid = kill(run, fault, rng)
                if pid is not None:
                    kills.append((fault, counter))
                    print(f"{time.monotonic() - started:7.1f} s, batch {run.steps_done()}: killed {fault} (pid {pid})")
                next_kill = time.monotonic() + rng.uniform(*args.gap)
            time.sleep(0.5)
        code = run.finish()
        left = wait_no_survivors(run.marker)
    wall = time.monotonic() - started
    problems = [f"rl exited {code}, not 0"] if code != 0 else []
    problems += [f"processes left behind: {[cmdline(pid) for pid in left]}"] if left else []
    summary = json.loads((out / "summary.json").read_text())
    metrics = metric_lines(out)
    for process, key in (("trainer", "trainer/loss"), ("orchestrator", "train/reward")):
        steps = sorted(m["step"] for m in metrics if m.get("process") == process and key in m)
        if steps != list(range(args.steps)):
            problems.append(
                f"{process} logged steps {steps[:5]}... ({len(steps)}), not each of 0..{args.steps - 1} once"
            )
    try:
        check_unique_lines(out)
    except AssertionError as e:
        problems.append(str(e))
    row = account(out, "soak", f"{len(kills)} kills in {wall:.0f} s")
    if row.lost:
        problems.append(f"{row.lost} rollouts lost")
    drawn, landed = group_tasks(out, tomllib.loads(SMOKE.read_text())["orchestrator"]["group_size"])
    if landed - drawn:
        problems.append(f"groups written more often than drawn (env, task: times): {dict(landed - drawn)}")
    if drawn - landed:
        problems.append(f"groups drawn but never written nor pending (env, task: times): {dict(drawn - landed)}")

    final_counter = rerun_counter(out)
    rerun: Counter[str] = Counter()
    for (fault, counter), following in zip(kills, [*(c for _, c in kills[1:]), final_counter], strict=True):
        rerun[fault] += max(following - counter, 0)
    recoveries = summary.get("recoveries", {})
    print(f"\nrl exited {code} after {wall:.0f} s; {summary.get('steps_done')} steps; out: {out}")
    print(FaultRow.header())
    for fault in FAULTS:
        count = sum(f == fault for f, _ in kills)
        names = [
            n
            for n in recoveries
            if n == SUMMARY_NAMES.get(fault) or (fault == "env server" and n.startswith("train env server"))
        ]
        lost = sum(recoveries[n]["seconds_lost"] for n in names)
        print(FaultRow(fault, count, lost, rerun[fault]).line())
    print()
    report(row)
    print()
    print(RssRow.header())
    for role, before in warm.items():
        half, after = mid.get(role, 0.0), end.get(role, 0.0)
        print(RssRow(role, before, half, after, (after - half) / half if half else float("nan")).line())
    if problems:
        raise SystemExit("soak failed:\n  " + "\n  ".join(problems))
    print("\nsoak passed: finished by itself, every step once, no rollout lost or duplicated, nothing left running")


if __name__ == "__main__":
    main()
