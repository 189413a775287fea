"""Trainer settings A/B on a run's own batches: step time of each variant, interleaved.

    python -m scripts.bench.trainer_ab outputs/my_run --steps 3 4 5 \
        --variant "--share-prefixes false" --variant "--share-prefixes true"

Guarantee: nothing under the run directory is written. Each variant is a Trainer built from the
run's `configs/trainer.toml` (model, LoRA, attention, threads) with its own overrides and a
scratch output dir; in every round each variant trains every listed step's batch
(`rollouts/step_<n>/`) once, in turn, so load from other processes falls on all variants alike.
Prints each variant's step time per round and its median, with the process's CPU time over the
step (what a loaded box inflates least: others' work delays a step, it does not add to its CPU
seconds), the tokens the model ran (`computed_tokens`) and the samples' tokens. The variants start from the run's initial weights,
so with the same overrides they train the same numbers: the differences are time only.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
import time
from pathlib import Path

from envrl.config import resolve_config
from envrl.data.layout import batch_dir, process_config_file
from envrl.data.samples import read_batch
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import Learner
from envrl.trainer.parallel import init_runtime


def overrides(flags: str) -> list[tuple[str, str]]:
    """`--a.b v --c d` -> [("a.b", "v"), ("c", "d")] (every flag takes a value)."""
    words = shlex.split(flags)
    if len(words) % 2 or not all(w.startswith("--") for w in words[::2]):
        raise SystemExit(f"--variant {flags!r}: give trainer flags in pairs, e.g. '--share-prefixes false'")
    return [(k.removeprefix("--").replace("-", "_"), v) for k, v in zip(words[::2], words[1::2], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.trainer_ab", description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run's output dir (configs/trainer.toml, rollouts/step_<n>/)")
    parser.add_argument("--steps", type=int, nargs="+", required=True, help="batches to train, in order")
    parser.add_argument("--variant", action="append", required=True, help="trainer flags, one string a variant")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    setup_logging(LogConfig(level="WARNING"), process="bench")
    batches = {n: read_batch(batch_dir(args.run, n)) for n in args.steps}
    config_file = process_config_file(args.run, "trainer")
    with tempfile.TemporaryDirectory(prefix="trainer-ab-") as scratch:
        trainers = []
        for i, flags in enumerate(args.variant):
            config = resolve_config(TrainerConfig, [config_file], [*overrides(flags), ("output_dir", f"{scratch}/{i}")])
            trainers.append(Learner(config, init_runtime(config)))
        times: dict[str, list[float]] = {flags: [] for flags in args.variant}
        cpu: dict[str, list[float]] = {flags: [] for flags in args.variant}
        for round_ in range(args.rounds):
            for flags, trainer in zip(args.variant, trainers, strict=True):
                for n, samples in batches.items():
                    start = time.process_time()
                    stats = trainer.train_on(n, samples, where=f"rollouts/step_{n}")
                    cpu[flags].append(time.process_time() - start)
                    times[flags].append(stats["step_time_s"])
                    print(
                        f"round {round_} {flags!r} step {n}: {stats['step_time_s']:.2f} s ({cpu[flags][-1]:.1f} CPU s), "
                        f"{stats['computed_tokens']:.0f} of {stats['tokens']:.0f} tokens computed, loss {stats['loss']:.5g}",
                        flush=True,
                    )
    for flags, values in times.items():
        print(
            f"{flags!r}: median {statistics.median(values):.2f} s, {statistics.median(cpu[flags]):.1f} CPU s "
            f"over {len(values)} steps"
        )


if __name__ == "__main__":
    main()
