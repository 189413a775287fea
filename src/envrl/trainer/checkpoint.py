"""`checkpoints/step_<k>/` is the state after k steps (model's trained weights, optimizer, scheduler, every rank's
RNG), appearing only when complete; the newest `keep` are retained, and later ones are moved aside, never deleted."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from loguru import logger
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from envrl.data.layout import abandoned_checkpoints_dir, checkpoint_dir, checkpoints_root, published_steps
from envrl.runtime.atomic import publish, temp_sibling
from envrl.trainer.config import CheckpointConfig
from envrl.trainer.parallel import Runtime, barrier

if TYPE_CHECKING:
    from envrl.trainer.learner import Learner

TRAINER_STATE = "trainer_state.pt"
LOAD_TRAINED = StateDictOptions(strict=False)
"""Loading leaves the frozen weights alone; every trained one is still required, by `dcp.load`."""


class RankCountMismatch(ValueError):
    """A checkpoint written by a different number of ranks than this run has."""


def list_checkpoints(output_dir: Path) -> list[int]:
    """Steps with a published checkpoint, oldest first."""
    return published_steps(checkpoints_root(output_dir))


@contextmanager
def _single_process_ok() -> Iterator[None]:
    """DCP warns about running without a process group; for the one-process CPU trainer that is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _trained_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state to checkpoint: of the model only the weights that train (all of
    them, or with LoRA the adapter: the frozen base is `model.name`, loaded again on resume)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    # every name of a frozen tensor: torch's ignore_frozen_params misses tied aliases (lm_head)
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {"model": {k: v for k, v in model_state.items() if k not in frozen}, "optim": optim_state}


def _rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_aside_abandoned(output_dir: Path, step: int) -> list[Path]:
    """Move every checkpoint at or past `step` to `checkpoints/abandoned/` (a name taken there
    gets a suffix); the new places."""
    moved = []
    aside = abandoned_checkpoints_dir(output_dir)
    for later in (s for s in list_checkpoints(output_dir) if s >= step):
        source = checkpoint_dir(output_dir, later)
        aside.mkdir(exist_ok=True)
        target, n = aside / source.name, 1
        while target.exists():
            target, n = aside / f"{source.name}.{n}", n + 1
        source.rename(target)
        moved.append(target)
    if moved:
        logger.warning(
            f"checkpoints {[p.name for p in moved]} were left by a run that went further before this one resumed "
            f"from an earlier step; moved to {aside} (delete them once they are not needed)"
        )
    return moved


class Checkpoints:
    """One run's checkpoints of one `Learner`: when one is due, writing it, reading it back (all
    ranks call `save` and `load`)."""

    def __init__(
        self, output_dir: Path, ckpt: CheckpointConfig, max_steps: int, learner: Learner, runtime: Runtime
    ) -> None:
        self.output_dir = output_dir
        self.ckpt = ckpt
        self.max_steps = max_steps
        self.learner = learner
        self.runtime = runtime

    def due(self, step: int) -> bool:
        """Whether the state after `step` completed steps is checkpointed: on the interval, and the last."""
        interval = self.ckpt.interval
        return bool(interval) and (step % interval == 0 or step == self.max_steps)

    def latest(self) -> int | None:
        """The newest published checkpoint's step (None: none yet)."""
        found = list_checkpoints(self.output_dir)
        return found[-1] if found else None

    def save(self, step: int) -> Path:
        """Write the state after `step` completed steps and prune all but the newest `ckpt.keep`."""
        output_dir, runtime, learner = self.output_dir, self.runtime, self.learner
        final = checkpoint_dir(output_dir, step)
        tmp = temp_sibling(final)
        if runtime.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(runtime)
        try:
            with _single_process_ok():
                dcp.save(
                    _trained_state(learner.model, learner.optimizer), checkpoint_id=tmp, no_dist=not runtime.sharded
                )
            torch.save(_rng_state(), tmp / _rng_file(runtime.rank))
            if runtime.is_main:
                meta = {"step": step, "scheduler": learner.scheduler.state_dict(), "world_size": runtime.world_size}
                torch.save(meta, tmp / TRAINER_STATE)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)  # never published; frees what a full disk let us write
            if isinstance(e, CheckpointException):  # a BaseException: callers catching Exception would miss it
                raise RuntimeError(f"torch.distributed.checkpoint failed: {str(e).strip().splitlines()[-1]}") from e
            raise
        barrier(runtime)
        if runtime.is_main:
            set_aside_abandoned(output_dir, step)
            publish(tmp, final)
            for old in list_checkpoints(output_dir)[: -self.ckpt.keep]:
                shutil.rmtree(checkpoint_dir(output_dir, old))
            logger.info(f"checkpoint {final} written")
        barrier(runtime)
        return final

    def load(self, step: int) -> None:
        """Restore the state `save` wrote for `step`."""
        runtime, learner = self.runtime, self.learner
        path = checkpoint_dir(self.output_dir, step)
        if not (path / TRAINER_STATE).is_file():
            found = list_checkpoints(self.output_dir)
            raise FileNotFoundError(f"no checkpoint at {path} (checkpoints found for steps: {found or 'none'})")
        meta = torch.load(path / TRAINER_STATE, weights_only=True)
        if meta["world_size"] != runtime.world_size:
            raise RankCountMismatch(
                f"{path} was written by {meta['world_size']} ranks but this run has {runtime.world_size}; "
                "resume with the same number of ranks (placement.trainer.gpus / num_procs; RNG state is per rank)"
            )
        state = _trained_state(learner.model, learner.optimizer)
        with _single_process_ok():
            dcp.load(state, checkpoint_id=path, no_dist=not runtime.sharded)
        set_state_dict(
            learner.model,
            learner.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=LOAD_TRAINED,
        )
        learner.scheduler.load_state_dict(meta["scheduler"])
        rng = torch.load(path / _rng_file(runtime.rank), weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])
        logger.info(f"resumed from {path}")
