"""envrl end to end vs the single-process floor, on the same work.

    uv run --no-sync python -m scripts.bench.e2e [--steps 20] [--levels 0 2] [--prompts 8] [--group 8] [--max-tokens 32]

Runs `rl` on configs/debug/cpu_smoke.toml reshaped to `prompts × group` completions of at most
`max-tokens` tokens per step, once per async level, then scripts/bench/floor.py's single-process
GRPO loop on the same shape, and prints one table: start-up phases (seconds from launching `rl`
until vLLM's `/health` answers, until the first published batch, and until the first trained
step), envrl's median step time and its split
(generation per rollout, the orchestrator's wait for the trainer, trainer compute and its wait for
batches), the floor's median step, their ratio, and the speed-up of async over on-policy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from statistics import fmean, median

import httpx

from scripts.bench.floor import run_floor
from scripts.chaos.harness import free_port

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


def run_envrl(
    level: int, steps: int, prompts: int, group: int, max_tokens: int, out: Path, pin: bool = False
) -> dict[str, float]:
    """One `rl` run; its start-up phases and median step split, from `metrics.jsonl`."""
    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(ROOT / "configs/debug/cpu_smoke.toml"),
        "--output-dir", str(out), "--max-async-level", str(level), "--max-steps", str(steps),
        "--orchestrator.batch-size", str(prompts * group), "--orchestrator.group-size", str(group),
        "--orchestrator.max-inflight", str(2 * prompts * group),
        "--orchestrator.sampling.max-tokens", str(max_tokens), "--wandb.mode", "disabled", "--clean",
        "--cpus.pin", json.dumps(pin),
    ]  # fmt: skip
    port = free_port()
    argv += ["--inference.port", str(port)]
    launched = time.time()
    rl = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
    ready = wait_for_health(f"http://127.0.0.1:{port}/health", rl)
    if rl.wait() != 0:
        raise SystemExit(f"rl exited with {rl.returncode}; see {out}/logs")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    orch = [r for r in records if "perf/step_time" in r]
    trainer = [r for r in records if "trainer/step_time_s" in r]
    steady = slice(2, None) if steps > 4 else slice(None)  # the first steps include warm-up
    trained = [r["time"] for r in trainer]
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--floor-steps", type=int, default=10)
    parser.add_argument("--pin", action="store_true", help="run with cpus.pin = true (own cores per role)")
    args = parser.parse_args()
    shape = (args.prompts, args.group, args.max_tokens)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="envrl-bench-") as tmp:
        for level in args.levels:
            print(f"envrl: max_async_level={level}, {args.steps} steps of {shape} ...", flush=True)
            results[f"envrl async {level}"] = run_envrl(
                level, args.steps, *shape, Path(tmp) / f"async{level}", pin=args.pin
            )
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
        envrl_step = results[f"envrl async {level}"]["median step s"]
        print(f"envrl async {level} / floor: {envrl_step / floor_step:.2f}x the floor's step time")
    if len(args.levels) == 2:
        a, b = (results[f"envrl async {level}"]["median step s"] for level in args.levels)
        print(f"speed-up async {args.levels[1]} vs {args.levels[0]}: {a / b:.2f}x")


if __name__ == "__main__":
    main()
