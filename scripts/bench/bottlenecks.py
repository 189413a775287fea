"""Runs built to be slow, as diagnosed and with the advice applied: does the advice move the step rate?

    flock /tmp/envrl-heavy.lock uv run --no-sync python -m scripts.bench.bottlenecks [--rounds 2] [--steps 6]

For each unbalanced config of `configs/debug/` (bound_scoring, bound_sync, bound_trainer) the run is
made as given, its advice on the setting the config was built for (`telemetry/advice.py`, read back
from its summary.json) applied to a copy of the config, and that run made too; with `--rounds` > 1 the two alternate (A B A B), so a
box that slows down hurts both alike. Printed per config: the advice, the speed-up the model
expected, and steps per minute of each run (the trainer's step wall times from the ledger, the first
step left out: it carries vLLM's start) with the measured ratio. `balanced.toml` is run once: its
advice (none expected) is printed. Run from the checkout (the scoring env is in tests/support).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from statistics import fmean
from typing import Any

import tomli_w

from envrl.data.summary import read_summary
from envrl.telemetry.advice import Advice, Diagnosis
from envrl.telemetry.diagnosis import ledger_steps
from envrl.telemetry.ledger import read_ledger

ROOT = Path(__file__).resolve().parents[2]
UNBALANCED = {
    "bound_scoring": "orchestrator.envs[slow].pool",
    "bound_sync": "max_async_level",
    "bound_trainer": "trainer.micro_batch_tokens",
}
"""Each unbalanced config and the setting its advice must name (the one applied, wherever it ranks)."""


def run(config: Path, out: Path, steps: int) -> None:
    argv = [sys.executable, "-m", "envrl.launcher.main", "--config", str(config), "--output-dir", str(out)]
    argv += ["--max-steps", str(steps), "--no-report"]
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)


def steps_per_min(out: Path) -> float:
    """60 / the mean wall time of the trainer's steps after the first."""
    walls = [s.wall for s in ledger_steps(read_ledger(out))[1:]]
    return 60.0 / fmean(walls)


def advice_for(out: Path, setting: str | None) -> tuple[Diagnosis | None, Advice | None]:
    """The run's diagnosis of its last steps and its advice on `setting` (None: its first advice)."""
    found = [Diagnosis.model_validate(d) for d in read_summary(out).get("diagnosis") or []]
    if not found:
        return None, None
    named = [a for a in found[0].advice if setting is None or a.setting == setting]
    return found[0], (named[0] if named else None)


def apply(config: dict[str, Any], advice: Advice) -> dict[str, Any]:
    """`config` with `advice` applied as a user would write it."""
    target = re.search(r"-> (\d+)", advice.change)
    if advice.setting == "max_async_level" and target:
        config["max_async_level"] = int(target.group(1))
    elif advice.setting == "trainer.micro_batch_tokens" and target:
        config.setdefault("trainer", {})["micro_batch_tokens"] = int(target.group(1))
    elif (env := re.fullmatch(r"orchestrator\.envs\[(.+)\]\.pool", advice.setting)) and (
        workers := re.search(r"max_workers = (\d+)", advice.change)
    ):
        [table] = [e for e in config["orchestrator"]["envs"] if (e.get("name") or e.get("id")) == env.group(1)]
        table["pool"] = {"min_workers": int(workers.group(1)), "max_workers": int(workers.group(1))}
    else:
        raise SystemExit(f"the bench cannot apply {advice.setting!r} ({advice.change}) to a config")
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="A/B pairs per config, alternated")
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is left out)")
    parser.add_argument("--configs", nargs="+", default=list(UNBALANCED))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="envrl-bottlenecks-") as tmp:
        root = Path(tmp)
        for name in args.configs:
            source = ROOT / "configs" / "debug" / f"{name}.toml"
            base, advised = [], []
            diagnosis = advice = None
            for i in range(args.rounds):
                out = root / f"{name}-{i}"
                run(source, out, args.steps)
                base.append(steps_per_min(out))
                if advice is None:
                    diagnosis, advice = advice_for(out, UNBALANCED[name])
                    if advice is None:
                        break
                    changed = root / f"{name}-advised.toml"
                    changed.write_text(tomli_w.dumps(apply(tomllib.loads(source.read_text()), advice)))
                out = root / f"{name}-{i}-advised"
                run(changed, out, args.steps)
                advised.append(steps_per_min(out))
                print(f"{name} round {i}: {base[-1]:.1f} -> {advised[-1]:.1f} steps/min", flush=True)
            rows.append((name, diagnosis, advice, base, advised))
        run_balanced = ROOT / "configs" / "debug" / "balanced.toml"
        run(run_balanced, root / "balanced", args.steps)
        balanced, _ = advice_for(root / "balanced", None)
    print("\n| config | bound | advice | expected | steps/min as given | with the advice | measured |")
    print("|---|---|---|---|---|---|---|")
    for name, diagnosis, advice, base, advised in rows:
        bound = f"{diagnosis.bound} {diagnosis.bound_share:.0%}" if diagnosis else "none"
        if advice is None:
            print(f"| {name} | {bound} | none | | {fmean(base):.1f} | | |")
            continue
        runs = " / ".join(f"{v:.1f}" for v in base), " / ".join(f"{v:.1f}" for v in advised)
        print(
            f"| {name} | {bound} | {advice.setting}: {advice.change} | {advice.speedup:.2f}x | {runs[0]} | {runs[1]} "
            f"| {fmean(advised) / fmean(base):.2f}x |"
        )
    if balanced is not None:
        print(f"\nbalanced: {balanced.line()}; advice: {[a.setting for a in balanced.advice] or 'none'}")


if __name__ == "__main__":
    main()
