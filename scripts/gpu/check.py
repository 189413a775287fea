"""Every GPU check of the trainer in one command, on a bare GPU image, within a time budget.

    python scripts/gpu/check.py                          # on the GPU machine (cuda), kit at outputs/gpu-kit
    python scripts/gpu/check.py --device cpu             # the same steps at a tiny shape, here
    python scripts/gpu/check.py --dry-run                # print the steps only
    python scripts/gpu/check.py --only bench-default,profile   # a subset, in the plan's order

Guarantee: uses only the standard library until the kit is installed: the kit's wheels
(`scripts/gpu/build_kit.py`) are unpacked into a temporary directory (no pip, no network) and put
on PYTHONPATH with `src/` and the repo root; each step runs as its own process with a deadline
cut to what is left of `--budget-s`, so the whole run ends within the budget however a step
hangs; every step's output goes to `<out>/<step>.log` and one line of `<out>/summary.md`, written
as the steps finish (a cut-off run keeps what it had). Exit 0 only if every step passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ["-m", "scripts.bench.trainer_throughput", "--publish", "false"]
PLAIN = ["-m", "scripts.bench.plain_step"]
BEFORE = ROOT / "outputs" / "gpu-before"
"""Optional: a copy of an older tree (`git archive <commit> src scripts tests/support tests/__init__.py`)
whose bench runs as the step `bench-before`, from that tree, on the same card in the same call."""
BEFORE_TAG = "<before>"
TINY_MODEL = ROOT / "outputs" / "bench" / "trainer_throughput" / "qwen3-tiny-random"
GROUPS = ["--sample-len", "2048", "--prompt-len", "1024", "--group-size", "8"]
TINY = ["--shape", "qwen3-tiny", "--seq-len", "256", "--prompt-len", "16", "--steps", "1", "--compile", "false"]


def steps(device: str, out: Path) -> list[tuple[str, list[str], int]]:
    """(name, python argv, seconds) in order of importance; the first bench builds the model."""
    if device == "cpu":
        return [
            ("bench-default", [*BENCH, *TINY], 120),
            ("bench-packed", [*BENCH, *TINY, "--sample-len", "64"], 120),
            ("plain-step", [*PLAIN, "--model", str(TINY_MODEL), "--seq-len", "256", "--prompt-len", "16"], 120),
            ("profile", [*BENCH, *TINY, "--profile", str(out / "trace.json")], 120),
            ("parity", ["-m", "scripts.gpu.parity", "--device", "cpu"], 420),
        ]
    plan = [
        ("bench-default", BENCH, 150),  # compile auto (on), recompute auto; compiles cold
        ("attention-kernels", ["-m", "scripts.bench.attention_kernels"], 60),  # what SDPA_FROM_TOKENS rests on
        ("parity", ["-m", "scripts.gpu.parity", "--device", "cuda"], 120),
    ]
    if BEFORE.is_dir():  # the trainer before issue 38, same card, same call: the "before" of every row
        plan.append(("bench-before", [BEFORE_TAG, *BENCH], 90))
    return [
        *plan,
        ("plain-step", PLAIN, 60),  # a TRL-style step beside envrl's (scripts/bench/plain_step.py)
        ("bench-packed-2k", [*BENCH, "--sample-len", "2048"], 75),
        # RL-shaped rows: groups of 8 samples of 2k tokens sharing a 1k prompt, prompt once vs 8 times
        ("bench-groups-shared", [*BENCH, *GROUPS, "--share-prefixes", "true"], 60),
        ("bench-groups-unshared", [*BENCH, *GROUPS, "--share-prefixes", "false"], 60),
        ("bench-no-recompute", [*BENCH, "--activation-checkpointing", "false"], 50),
        ("plain-step-compiled", [*PLAIN, "--compile"], 75),
        ("bench-compile-off", [*BENCH, "--compile", "false"], 50),
        ("profile", [*BENCH, "--steps", "1", "--profile", str(out / "trace.json")], 50),
        ("bench-recompute-on-compile-off", [*BENCH, "--compile", "false", "--activation-checkpointing", "true"], 50),
    ]


def install_kit(kit: Path) -> Path:
    """The kit's pure-Python wheels, and its compiled ones whose module this interpreter cannot
    already import, unpacked into a fresh temporary directory (wheels are zip files whose top
    level is what goes on sys.path; a wheel's name starts with its module's). Pure ones always
    go first on the path (an image's older typing-extensions must not shadow the one pydantic
    needs); a cp312 build never shadows another Python's own."""
    wheels = sorted(kit.glob("*.whl"))
    if not wheels:
        raise SystemExit(
            f"check: no wheels in {kit}; build them where envrl is installed: python -m scripts.gpu.build_kit"
        )
    target = Path(tempfile.mkdtemp(prefix="envrl-gpu-kit-"))
    for wheel in wheels:
        if wheel.name.endswith("-py3-none-any.whl") or importlib.util.find_spec(wheel.name.split("-")[0]) is None:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(target)
            print(f"kit: {wheel.name}", flush=True)
    return target


def run_step(name: str, argv: list[str], seconds: float, env: dict[str, str], out: Path) -> tuple[str, float, str]:
    """(status, seconds taken, the step's last JSON line or last line); an argv starting with
    `BEFORE_TAG` runs in the `BEFORE` tree, with its `src/` instead of this one's."""
    start = time.monotonic()
    cwd = ROOT
    if argv[0] == BEFORE_TAG:
        argv, cwd = argv[1:], BEFORE
        site = env["PYTHONPATH"].split(os.pathsep)[0]
        env = {**env, "PYTHONPATH": os.pathsep.join([site, str(BEFORE / "src"), str(BEFORE)])}
    log = out / f"{name}.log"
    with log.open("w") as f:
        try:
            done = subprocess.run(
                [sys.executable, *argv], cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=seconds
            )
            status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out ({seconds:.0f}s)"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    rows = [line for line in lines if line.startswith("{")]
    return status, time.monotonic() - start, (rows[-1] if rows else lines[-1] if lines else "")


def run_all(plan: list[tuple[str, list[str], int]], site: Path, out: Path, budget_s: float, start: float) -> int:
    """Run the steps in order within what is left of `budget_s`; returns how many did not pass."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src"), str(ROOT)])}
    summary = out / "summary.md"
    summary.write_text("| step | status | s | result |\n|---|---|---|---|\n")
    failed = 0
    for name, argv, seconds in plan:
        left = budget_s - (time.monotonic() - start)
        if left < 15:
            status, took, result = "skipped (budget spent)", 0.0, ""
        else:
            status, took, result = run_step(name, argv, min(seconds, left), env, out)
        failed += status != "ok"
        with summary.open("a") as f:
            f.write(f"| {name} | {status} | {took:.0f} | {result} |\n")
        print(f"{name}: {status} in {took:.0f}s {result}", flush=True)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--kit", type=Path, default=ROOT / "outputs" / "gpu-kit")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "outputs" / "gpu-check")))
    parser.add_argument("--budget-s", type=float, default=520.0, help="the whole run's wall-clock limit")
    parser.add_argument("--only", default="", help="comma-separated step names to run (default: all)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()
    plan = steps(args.device, args.out)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {name for name, _, _ in plan}
        if unknown:
            raise SystemExit(f"check: no step named {sorted(unknown)}; --dry-run lists them")
        plan = [step for step in plan if step[0] in wanted]
    if args.dry_run:
        for name, argv, seconds in plan:
            print(f"{name} (<= {seconds}s): python {' '.join(argv)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    site = install_kit(args.kit)
    try:
        failed = run_all(plan, site, args.out, args.budget_s, start)
    finally:
        shutil.rmtree(site, ignore_errors=True)
    print((args.out / "summary.md").read_text())
    print(json.dumps({"total_s": round(time.monotonic() - start), "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
