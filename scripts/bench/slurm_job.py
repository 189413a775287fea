"""Submit -> first trained step, and step time, of the 3-host smoke job on the SLURM box
(`scripts.slurm_box`) against the same config under `rl` on this box, interleaved.

    python -m scripts.slurm_box up --nodes 3      # as root
    uv run --no-sync python -m scripts.bench.slurm_job --rounds 2

The job is `configs/debug/slurm_smoke.toml` (weights in memory); the one-box run is the same file
with `--slurm` left out. Step time: median interval between the trainer's metric lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.slurm_box.box import environ
from scripts.slurm_box.conf import Box
from tests.support.ports import free_base_port, free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "debug" / "slurm_smoke.toml"


def trainer_times(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return sorted(m["time"] for m in map(json.loads, lines) if m.get("process") == "trainer" and "trainer/loss" in m)


def one_box(out: Path) -> float:
    rl = [sys.executable, "-m", "envrl.launcher.main", "--config", str(CONFIG), "--output-dir", str(out)]
    ports = ["--inference.port", str(free_port()), "--env-server-base-port", str(free_base_port())]  # a shared box
    start = time.time()
    subprocess.run([*rl, *ports, "--no-report"], cwd=ROOT, check=True, capture_output=True)
    return start


def slurm_job(box: Box, out: Path) -> float:
    argv = [sys.executable, "-m", "envrl.launcher.main", "--config", str(CONFIG), "--output-dir", str(out)]
    written = subprocess.run([*argv, "--no-report", "--slurm"], cwd=ROOT, check=True, capture_output=True, text=True)
    start = time.time()
    sbatch = ["sbatch", "--wait", written.stdout.strip().splitlines()[-1]]
    subprocess.run(sbatch, cwd=ROOT, env=environ(box), check=True, capture_output=True)
    return start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    box = Box(nodes=3)
    rows: dict[str, list[tuple[float, float]]] = {"rl on one box": [], "3-host SLURM job": []}
    with tempfile.TemporaryDirectory(dir=ROOT / "outputs") as tmp:
        for round_ in range(args.rounds):
            for name, run in (("rl on one box", one_box), ("3-host SLURM job", lambda out: slurm_job(box, out))):
                out = Path(tmp) / f"{name.split()[0]}-{round_}"
                start = run(out)
                times = trainer_times(out)
                steps = [b - a for a, b in zip(times, times[1:], strict=False)]
                rows[name].append((times[0] - start, statistics.median(steps)))
    print(f"{'':<18} {'start -> first trained step (s)':>32} {'median step (s)':>16}   ({os.cpu_count()} cores)")
    for name, values in rows.items():
        first = ", ".join(f"{v[0]:.1f}" for v in values)
        step = ", ".join(f"{v[1]:.2f}" for v in values)
        print(f"{name:<18} {first:>32} {step:>16}")


if __name__ == "__main__":
    main()
