"""`rl replay --step N OUTPUT_DIR`: recompute trainer step N offline and say where it departs
from what the run logged.

Guarantee: nothing under OUTPUT_DIR is written. The trainer is rebuilt from the run's own
`configs/trainer.toml`, restored from the newest checkpoint at or before N, and trains the kept
batches from there through N exactly as the run did (same code, model, optimizer, schedule and
RNG state). For each step it reports loss and grad norm beside the logged ones; after step N it
compares every parameter with the policy the run published for step N + 1 and names the first
tensor that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger
from safetensors.torch import load_file

from envrl.config import ConfigError, load_config
from envrl.data.layout import batch_dir, checkpoints_root, configs_dir, metrics_file, published_steps, weights_dir
from envrl.data.samples import read_batch
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.checkpoint import RankCountMismatch, load_checkpoint
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import full_state_dict, init_runtime, shutdown
from envrl.transport import TRANSFER_FILE

COMPARED = ("loss", "grad_norm")
"""The step metrics a replay recomputes and sets beside the logged ones."""


class ReplayError(RuntimeError):
    """Step N cannot be replayed from what the run kept; the message says what is missing."""


@dataclass(frozen=True)
class TensorDiff:
    name: str
    max_abs_diff: float


def start_checkpoint(output_dir: Path, step: int) -> int:
    """The newest checkpoint at or before `step` whose batches from there through `step` are kept."""
    candidates = [c for c in published_steps(checkpoints_root(output_dir)) if c <= step]
    if not candidates:
        found = published_steps(checkpoints_root(output_dir))
        raise ReplayError(
            f"no checkpoint at or before step {step} under {checkpoints_root(output_dir)} (found: {found or 'none'}); "
            "replay starts from a checkpoint (trainer.ckpt.interval, trainer.ckpt.keep)"
        )
    start = candidates[-1]
    missing = [s for s in range(start, step + 1) if not batch_dir(output_dir, s).is_dir()]
    if missing:
        raise ReplayError(
            f"batches {missing} are gone from {batch_dir(output_dir, missing[0]).parent}: replaying step {step} "
            f"from checkpoint {start} needs every batch from {start} to {step} (orchestrator.batch_retention = 'all' keeps them)"
        )
    return start


def logged_trainer_metrics(output_dir: Path) -> dict[int, dict[str, float]]:
    """The trainer's metrics line of each step, as the run wrote them (the last line of a step wins)."""
    logged: dict[int, dict[str, float]] = {}
    path = metrics_file(output_dir)
    if not path.is_file():
        return logged
    with path.open() as f:
        for line in f:
            record = json.loads(line)
            if record.get("process") == "trainer":
                logged[record["step"]] = {k.removeprefix("trainer/"): v for k, v in record.items()}
    return logged


def first_difference(state: dict[str, torch.Tensor], published: dict[str, torch.Tensor]) -> TensorDiff | None:
    """The first parameter (in the model's order) not bitwise equal to the published one (a tied
    parameter the published files leave out is compared through the one it is tied to)."""
    if not published.keys() & state.keys():
        raise ReplayError("the published policy shares no tensor name with the trainer's model")
    for name, tensor in state.items():
        other = published.get(name)
        if other is None:
            continue
        if not torch.equal(tensor.to(other.dtype), other):
            return TensorDiff(name, (tensor.to(other.dtype) - other).abs().max().item())
    return None


def _beside_logged(key: str, value: float, logged: dict[str, float]) -> str:
    if key not in logged:
        return f"{key} {value:.6g} (not logged)"
    then = logged[key]
    same = "same as logged" if value == then else f"logged {then:.6g}, diff {value - then:.3g}"
    return f"{key} {value:.6g} ({same})"


def published_state(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def replay(output_dir: Path, step: int) -> TensorDiff | None:
    """Replay up to and including `step`, log each step against the run, return the first difference."""
    config_path = configs_dir(output_dir) / "trainer.toml"
    if not config_path.is_file():
        raise ReplayError(f"{config_path} is missing: {output_dir} is not a run directory `rl` wrote")
    config = load_config(TrainerConfig, ["--config", str(config_path)], prog="rl replay")
    if step >= config.max_steps:
        raise ReplayError(f"step {step} is past the run's last step {config.max_steps - 1}")
    start = start_checkpoint(output_dir, step)
    logged = logged_trainer_metrics(output_dir)
    runtime = init_runtime(config)
    try:
        trainer = Trainer(config, runtime)
        load_checkpoint(output_dir, start, trainer.model, trainer.optimizer, trainer.scheduler, runtime)
        for s in range(start, step + 1):
            where = str(batch_dir(output_dir, s))
            stats = trainer.train_on(s, read_batch(batch_dir(output_dir, s)), where=where)
            logger.info(f"step {s}: " + ", ".join(_beside_logged(k, stats[k], logged.get(s, {})) for k in COMPARED))
        state = full_state_dict(trainer.model, runtime)
    finally:
        shutdown(runtime)
    target = weights_dir(output_dir, step + 1)
    if config.lora is not None:
        logger.warning(f"a LoRA run: loss and grad norm replayed; its adapter is not compared with {target} yet")
        return None
    if not target.is_dir() or (target / TRANSFER_FILE).is_file():
        logger.warning(f"{target} was not kept as files: no published policy to compare step {step}'s weights with")
        return None
    diff = first_difference(state, published_state(target))
    if diff is None:
        logger.success(f"step {step} replayed from checkpoint {start}: every tensor equals {target} bit for bit")
    else:
        logger.warning(
            f"step {step} replayed from checkpoint {start}: first tensor that differs from {target} is "
            f"{diff.name} (max abs diff {diff.max_abs_diff:.3g})"
        )
    return diff


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rl replay",
        description="Recompute trainer step N of a run from its checkpoint and kept batches; compare with what it logged.",
    )
    parser.add_argument("output_dir", type=Path, help="the run directory")
    parser.add_argument("--step", type=int, required=True, help="the trainer step to recompute (0-based)")
    args = parser.parse_args(argv)
    setup_logging(LogConfig(), process="replay")
    try:
        diff = replay(args.output_dir, args.step)
    except (ReplayError, ConfigError, FileNotFoundError, RankCountMismatch) as e:
        print(f"rl replay: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    raise SystemExit(0 if diff is None else 1)
