"""`rl replay --step N OUTPUT_DIR`: recomputes step N offline from the run's own config and checkpoints, writing
nothing there, and names the first tensor beyond float32's tolerance of the policy the run published."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger
from safetensors.torch import load_file

from envrl.config import ConfigError, load_config
from envrl.data.layout import (
    batch_dir,
    checkpoints_root,
    metrics_file,
    process_config_file,
    published_steps,
    weights_dir,
)
from envrl.data.samples import read_batch
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.checkpoint import Checkpoints, RankCountMismatch
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import Learner
from envrl.trainer.parallel import Runtime, full_state_dict, init_runtime, shutdown
from envrl.transport.source import transport_of

COMPARED = ("loss", "grad_norm")
"""The step metrics a replay recomputes and sets beside the logged ones."""

UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff u: one rounding moves a value by at most u times itself."""


class ReplayError(RuntimeError):
    """Step N cannot be replayed from what the run kept; the message says what is missing."""


@dataclass(frozen=True)
class TensorDiff:
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def within(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def __str__(self) -> str:
        side = "within" if self.within else "BEYOND"
        return f"{self.name}: max abs diff {self.max_abs_diff:.3g}, {side} its tolerance {self.tolerance:.3g}"


def tolerance(moved: float, largest: float, tokens: int, steps: int, betas: tuple[float, float]) -> float:
    """How far a replayed tensor may land from the published one when only the order of float32
    sums differs (another thread count, kernel or layout), not what was computed.

    Each gradient entry is a sum over a step's `tokens`; summed in another order it moves by at most
    about n·u of the sum of its terms' sizes (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., §4.2: |error| <= γ_n Σ|x_i|, γ_n ≈ n·u). AdamW turns a gradient into an
    update m/(√v + ε) in which a relative change δ of the gradient enters m with weight 1 - β1
    over √v >= √(1 - β2)·|g|: to first order the update moves by at most (1 - β1)/√(1 - β2) · δ
    (the gain of Kingma & Ba's bound on a step, §2.1) times the step's size, so by at most
    gain · n·u times what the replayed steps moved the tensor (`moved`: over the steps, the sum of
    the largest change of an entry); adding the update to the parameter rounds once more, by at
    most u of the tensor's largest entry, per step. A wrong batch, learning rate or code moves
    the update by about itself: relative 1, orders of magnitude beyond."""
    gain = max(1.0, (1 - betas[0]) / math.sqrt(1 - betas[1]))
    return gain * tokens * UNIT_ROUNDOFF * moved + steps * UNIT_ROUNDOFF * largest


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


def differences(
    state: dict[str, torch.Tensor], published: dict[str, torch.Tensor], tolerances: dict[str, float]
) -> list[TensorDiff]:
    """Each parameter (in the model's order) not bitwise equal to the published one, with its
    tolerance (a tied parameter the published files leave out is compared through the one it is
    tied to)."""
    if not published.keys() & state.keys():
        raise ReplayError("the published policy shares no tensor name with the trainer's model")
    found = []
    for name, tensor in state.items():
        other = published.get(name)
        if other is None or torch.equal(tensor.to(other.dtype), other):
            continue
        diff = (tensor.to(other.dtype) - other).abs().max().item()
        found.append(TensorDiff(name, diff, tolerances[name]))
    return found


def _beside_logged(key: str, value: float, logged: dict[str, float], tokens: int) -> str:
    """The replayed metric beside the logged one; a mean over the step's tokens summed in another
    order may move by n·u of its size (γ_n, see `tolerance`), so a difference is judged by that."""
    if key not in logged:
        return f"{key} {value:.6g} (not logged)"
    then = logged[key]
    if value == then:
        return f"{key} {value:.6g} (same as logged)"
    allowed = tokens * UNIT_ROUNDOFF * abs(then)
    side = "within" if abs(value - then) <= allowed else "BEYOND"
    return f"{key} {value:.6g} (logged {then:.6g}, diff {value - then:.3g}, {side} the tolerance {allowed:.3g})"


def published_state(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def replay(output_dir: Path, step: int) -> TensorDiff | None:
    """Replay up to and including `step`, log each step against the run and each differing tensor
    against its tolerance; return the first tensor beyond its tolerance."""
    config_path = process_config_file(output_dir, "trainer")
    if not config_path.is_file():
        raise ReplayError(f"{config_path} is missing: {output_dir} is not a run directory `rl` wrote")
    config = load_config(TrainerConfig, ["--config", str(config_path)], prog="rl replay")
    if step >= config.max_steps:
        raise ReplayError(f"step {step} is past the run's last step {config.max_steps - 1}")
    start = start_checkpoint(output_dir, step)
    logged = logged_trainer_metrics(output_dir)
    runtime = init_runtime(config)
    try:
        learner = Learner(config, runtime)
        Checkpoints(output_dir, config.ckpt, config.max_steps, learner, runtime).load(start)
        state = _snapshot(learner.model, runtime)
        moved, tokens = dict.fromkeys(state, 0.0), 0
        for s in range(start, step + 1):
            batch = read_batch(batch_dir(output_dir, s))
            n = sum(len(sample.input_ids) for sample in batch)
            tokens = max(tokens, n)
            stats = learner.train_on(s, batch, where=str(batch_dir(output_dir, s)))
            logger.info(f"step {s}: " + ", ".join(_beside_logged(k, stats[k], logged.get(s, {}), n) for k in COMPARED))
            before, state = state, _snapshot(learner.model, runtime)
            for name, tensor in state.items():
                moved[name] += (tensor - before[name]).abs().max().item() if tensor.numel() else 0.0
    finally:
        shutdown(runtime)
    target = weights_dir(output_dir, step + 1)
    if config.lora is not None:
        logger.warning(f"a LoRA run: loss and grad norm replayed; its adapter is not compared with {target} yet")
        return None
    if not target.is_dir() or transport_of(target) == "memory":
        logger.warning(f"{target} was not kept as files: no published policy to compare step {step}'s weights with")
        return None
    steps = step + 1 - start
    tolerances = {
        name: tolerance(moved[name], t.abs().max().item() if t.numel() else 0.0, tokens, steps, config.optim.betas)
        for name, t in state.items()
    }
    return _verdict(
        differences(state, published_state(target), tolerances), f"step {step} replayed from checkpoint {start}", target
    )


def _verdict(found: list[TensorDiff], replayed: str, target: Path) -> TensorDiff | None:
    """Log how the replayed tensors compare with `target`'s; the first beyond its tolerance."""
    beyond = [d for d in found if not d.within]
    if not found:
        logger.success(f"{replayed}: every tensor equals {target} bit for bit")
        return None
    for diff in found:
        logger.info(f"  {diff}")
    if not beyond:
        logger.success(
            f"{replayed}: {len(found)} tensors differ from {target}, each within the tolerance of float32 sums "
            "in another order (another thread count or layout); the rest equal it bit for bit"
        )
        return None
    logger.warning(
        f"{replayed}: first tensor beyond its tolerance from {target} is {beyond[0].name} (max abs diff "
        f"{beyond[0].max_abs_diff:.3g}, tolerance {beyond[0].tolerance:.3g}); {len(beyond)} of {len(found)} "
        "differing tensors are beyond theirs"
    )
    return beyond[0]


def _snapshot(model: torch.nn.Module, runtime: Runtime) -> dict[str, torch.Tensor]:
    """The full parameters as they are now (copies: on one CPU process the state dict holds the live tensors)."""
    return {name: tensor.clone() for name, tensor in full_state_dict(model, runtime).items()}


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
