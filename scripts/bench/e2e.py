"""envrl end to end vs the single-process floor, on the same work.

    uv run --no-sync python -m scripts.bench.e2e [--steps 30] [--warmup 5] [--repeats 2] [--levels 0 2]
        [--prompts 8] [--group 8] [--max-tokens 32]

Runs `rl` on configs/debug/cpu_smoke.toml reshaped to `prompts × group` completions of at most
`max-tokens` tokens per step, once per async level, then scripts/bench/floor.py's single-process
GRPO loop on the same shape, and prints one table: start-up phases (seconds from launching `rl`
until vLLM's `/health` answers, until the first published batch, and until the first trained
step), envrl's median step time and its split
(generation per rollout, the orchestrator's wait for the trainer, trainer compute and its wait for
batches), the floor's median step, their ratio, and the speed-up of async over on-policy.

Steps are noisy on a shared box, so the step times count steady steps only (the first `warmup`
trained steps are dropped), the levels run `repeats` times interleaved (0, 2, 0, 2, ...), and
each cell is the median over repeats with the spread (min-max) of the step time printed below.
The CPU rows are a ledger of the steady steps: the CPU-seconds (user + system, from
/proc/<pid>/stat) each role of the run's process tree spent per step; their sum over 2 cores
is the shortest step this box could run that work in with perfect overlap. The time-ledger row
is the smallest share of a steady step's wall time that the recorded spans explain (the report's
`unaccounted` is the rest; it grows when the box is busy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from statistics import fmean, median

import httpx

from envrl.report.timeline import step_splits
from envrl.telemetry.ledger import read_ledger
from scripts.bench.floor import run_floor
from tests.support.ports import free_port
from tests.support.run_files import metric_lines

ROOT = Path(__file__).resolve().parents[2]


def wait_for_health(url: str, rl: subprocess.Popen[bytes]) -> float:
    """The time at which `url` first answers 200 (vLLM serves), polled every 0.1 s while `rl` runs."""
    while rl.poll() is None:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"rl exited with {rl.returncode} before {url} answered")


ROLES = (
    ("inference api", "envrl.inference.main"),
    ("inference engine", "EngineCore"),
    ("trainer", "envrl.trainer"),
    ("orchestrator", "envrl.orchestrator"),
    ("env server+workers", "envrl.serve"),
    ("launcher", "envrl.launcher.main"),
)
"""Role of a process in an `rl` tree: the first whose marker is in its command line or name."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """`root` and every descendant alive now."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children[pid]
    return tree


def role_cpu(pid: int) -> tuple[str, float] | None:
    """(role, CPU-seconds so far) of `pid`, or None if it is gone or has no role."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        label = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() + stat.split(")")[0]
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    role = next((name for name, marker in ROLES if marker in label), None)
    return None if role is None else (role, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)


class CpuLedger:
    """Samples the CPU-seconds of every process under `root` every `period` s, in a thread."""

    def __init__(self, root: int, period: float = 0.25) -> None:
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(root, period), daemon=True)
        self._thread.start()

    def _run(self, root: int, period: float) -> None:
        while not self._stop.wait(period):
            now = time.time()
            self.samples.append((now, {p: rc for p in process_tree(root) if (rc := role_cpu(p)) is not None}))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def per_step(self, start: float, end: float, steps: int) -> dict[str, float]:
        """CPU-seconds per step of each role between wall times `start` and `end` (`steps` steps);
        a process that ends inside the window (the orchestrator, before the last trained step)
        counts until its last sample."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or steps < 1:
            return {}
        scale = (end - start) / (inside[-1][0] - inside[0][0]) / steps  # samples span a little less
        first: dict[int, tuple[str, float]] = {}
        last: dict[int, tuple[str, float]] = {}
        for _, procs in inside:
            for pid, role_seconds in procs.items():
                first.setdefault(pid, role_seconds)
                last[pid] = role_seconds
        spent: dict[str, float] = defaultdict(float)
        for pid, (role, cpu) in last.items():
            spent[role] += cpu - first[pid][1]
        rows = {f"CPU s/step: {role}": spent[role] * scale for role, _ in ROLES if role in spent}
        rows["CPU s/step: total"] = sum(rows.values())
        return rows


def run_envrl(
    level: int, steps: int, warmup: int, prompts: int, group: int, max_tokens: int, out: Path, pin: bool = False
) -> dict[str, float]:
    """One `rl` run; its start-up phases and median step split, from `metrics.jsonl`."""
    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(ROOT / "configs/debug/cpu_smoke.toml"),
        "--output-dir", str(out), "--max-async-level", str(level), "--max-steps", str(steps),
        "--orchestrator.batch-size", str(prompts * group), "--orchestrator.group-size", str(group),
        "--orchestrator.max-inflight", str(2 * prompts * group),
        "--orchestrator.sampling.max-tokens", str(max_tokens), "--wandb.mode", "disabled", "--clean",
        "--orchestrator.eval.env", "[]",  # the floor evaluates nothing; evals every 10 steps would skew steady steps
        "--cpus.pin", json.dumps(pin),
    ]  # fmt: skip
    port = free_port()
    argv += ["--inference.port", str(port)]
    launched = time.time()
    rl = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    ledger = CpuLedger(rl.pid)
    ready = wait_for_health(f"http://127.0.0.1:{port}/health", rl)
    code = rl.wait()
    ledger.stop()
    if code != 0:
        raise SystemExit(f"rl exited with {code}; see {out}/logs")
    records = metric_lines(out)
    orch = [r for r in records if "perf/step_time" in r]
    trainer = [r for r in records if "trainer/step_time_s" in r]
    steady = slice(warmup, None) if steps > warmup + 2 else slice(None)  # the first steps include warm-up
    trained = [r["time"] for r in trainer]
    steady_times = trained[steady.start or 0 :]
    return {
        "start-up: inference ready s": ready - launched,
        "start-up: first batch s": orch[0]["time"] - launched,
        "start-up: first trained step s": trained[0] - launched,
        "median step s": median([b - a for a, b in pairwise(trained)][steady]),
        "generation s/rollout": fmean(v for r in orch[steady] for k, v in r.items() if k.endswith("/time_generation")),
        "orch waits for trainer s/step": fmean(r["perf/wait_for_trainer"] for r in orch[steady]),
        "trainer compute s/step": fmean(r["trainer/step_time_s"] for r in trainer[steady]),
        "trainer waits for batch s/step": fmean(r["trainer/wait_time_s"] for r in trainer[steady]),
        "reward first 3 -> last 3": fmean(r["train/reward"] for r in orch[-3:])
        - fmean(r["train/reward"] for r in orch[:3]),
        "time ledger: least-explained steady step": min(
            split.accounted for split in step_splits(read_ledger(out))[steady]
        ),
        **ledger.per_step(steady_times[0], steady_times[-1], len(steady_times) - 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="trained steps left out of the step statistics")
    parser.add_argument("--repeats", type=int, default=2, help="runs per level, interleaved")
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--floor-steps", type=int, default=10)
    parser.add_argument("--pin", action="store_true", help="run with cpus.pin = true (own cores per role)")
    args = parser.parse_args()
    shape = (args.prompts, args.group, args.max_tokens)
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="envrl-bench-") as tmp:
        for repeat in range(args.repeats):
            for level in args.levels:
                print(
                    f"envrl: max_async_level={level}, {args.steps} steps of {shape}, run {repeat + 1} ...", flush=True
                )
                out = Path(tmp) / f"async{level}-{repeat}"
                runs[f"envrl async {level}"].append(
                    run_envrl(level, args.steps, args.warmup, *shape, out, pin=args.pin)
                )
    results = {name: {k: median(r[k] for r in rs if k in r) for k in rs[0]} for name, rs in runs.items()}
    print(f"floor: {args.floor_steps} single-process steps of {shape} ...", flush=True)
    floor = run_floor(args.floor_steps, *shape)[1:]
    floor_step = median(s.total_s for s in floor)
    results["floor (1 process)"] = {
        "median step s": floor_step,
        "generation s/rollout": median(s.generation_s for s in floor) / (args.prompts * args.group),
        "trainer compute s/step": median(s.training_s for s in floor),
    }
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    print("\n| metric | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{r[key]:.3f}" if key in r else "" for r in results.values()) + " |")
    for level in args.levels:
        steps = sorted(r["median step s"] for r in runs[f"envrl async {level}"])
        envrl_step = results[f"envrl async {level}"]["median step s"]
        print(
            f"envrl async {level}: median step {envrl_step:.3f} s over {len(steps)} runs "
            f"(runs {' '.join(f'{s:.3f}' for s in steps)}), {envrl_step / floor_step:.2f}x the floor's step time"
        )
    if len(args.levels) == 2:
        a, b = (results[f"envrl async {level}"]["median step s"] for level in args.levels)
        print(f"speed-up async {args.levels[1]} vs {args.levels[0]}: {a / b:.2f}x")


if __name__ == "__main__":
    main()
