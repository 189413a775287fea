"""End-to-end throughput of the CPU smoke run, on-policy (max_async_level 0) vs async (2).

    uv run --no-sync python scripts/bench/e2e.py [--steps 30] [--levels 0 2]

Runs `rl` on configs/debug/cpu_smoke.toml once per level (start-up excluded from the numbers)
and prints steps/s and where the time of a step goes: the orchestrator's generation (mean
rollout), its wait for the trainer, and the trainer's compute and its wait for batches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[2]


def run(level: int, steps: int, out: Path) -> dict[str, float]:
    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(ROOT / "configs/debug/cpu_smoke.toml"),
        "--output-dir", str(out), "--max-async-level", str(level), "--max-steps", str(steps),
        "--wandb.mode", "disabled", "--clean",
    ]  # fmt: skip
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    orch = [r for r in records if "perf/step_time" in r]
    trainer = [r for r in records if "trainer/step_time_s" in r]
    wall = trainer[-1]["time"] - orch[0]["time"] + orch[0]["perf/step_time"]
    return {
        "steps/s": steps / wall,
        "wall s": wall,
        "generation s/rollout": fmean(v for r in orch for k, v in r.items() if k.endswith("/time_generation")),
        "orch waits for trainer s/step": fmean(r["perf/wait_for_trainer"] for r in orch),
        "trainer compute s/step": fmean(r["trainer/step_time_s"] for r in trainer),
        "trainer waits for batch s/step": fmean(r["trainer/wait_time_s"] for r in trainer),
        "reward last 5": fmean(r["train/reward"] for r in orch[-5:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="envrl-bench-") as tmp:
        for level in args.levels:
            print(f"running max_async_level={level} for {args.steps} steps ...", flush=True)
            results[level] = run(level, args.steps, Path(tmp) / f"async{level}")
    keys = list(next(iter(results.values())))
    print("\n| metric | " + " | ".join(f"async {level}" for level in results) + " |")
    print("|---|" + "---|" * len(results))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{r[key]:.3f}" for r in results.values()) + " |")
    if len(results) == 2:
        a, b = results.values()
        print(f"\nspeed-up async {args.levels[1]} vs {args.levels[0]}: {b['steps/s'] / a['steps/s']:.2f}x")


if __name__ == "__main__":
    main()
