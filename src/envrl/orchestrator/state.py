"""The orchestrator's state is written in the same rename as batch n, so publishing and saving are one fact; a
resume continues after the newest batch, re-dispatches `pending` and drops what later steps wrote (docs/running.md)."""

from __future__ import annotations

import os
from pathlib import Path

from loguru import logger
from pydantic import BaseModel

from envrl.data.layout import batch_dir, eval_rollouts_files, published_steps, rollouts_root, train_rollouts_file
from envrl.data.samples import TrainingSample
from envrl.runtime.atomic import filter_lines, fsync_file
from envrl.transport.batches import BatchSender

STATE_FILE = "orchestrator.json"
"""The state's file name inside a batch directory."""


class PendingGroup(BaseModel):
    """A group dispatched but not in a published batch: re-run (same task, same seed) on resume."""

    env: str
    task_idx: int
    seed: int


class OrchestratorState(BaseModel):
    step: int
    """The step whose batch this state was published with; a resume starts at `step + 1`."""
    positions: dict[str, int]
    """Tasks drawn so far per train env (with the seed, the whole sampling state)."""
    dispatched: int
    """Groups drawn so far (seeds and env picks are derived from it)."""
    counters: dict[str, int]
    """The `counters/...` metrics so far (rollouts dispatched, retried, requeued, ...)."""
    pending: list[PendingGroup]
    """Groups in flight, finished but unused, or requeued but not yet dispatched again when the
    batch was published."""
    train_rollouts_bytes: int | None = None
    """Size of `rollouts/train.jsonl` when the batch was published: a resume cuts the file there
    (None: a state from before this field; the resume then filters the file line by line)."""


def state_bytes(state: OrchestratorState) -> dict[str, bytes]:
    """The file(s) to publish beside the batch (`write_batch(..., extra=...)`)."""
    return {STATE_FILE: state.model_dump_json(indent=1).encode()}


def publish_step(
    batches: BatchSender, output_dir: Path, samples: list[TrainingSample], state: OrchestratorState
) -> None:
    """Batch `state.step` and the state after it, in one rename: the commit point of the step. The
    step's rollout lines are flushed to disk first (their size recorded), so a published step never lacks them."""
    rollouts = train_rollouts_file(output_dir)
    if rollouts.exists():
        fsync_file(rollouts)
    state = state.model_copy(update={"train_rollouts_bytes": rollouts.stat().st_size if rollouts.exists() else 0})
    batches.send_batch(state.step, samples, extra=state_bytes(state))


def resumed_state(output_dir: Path, resume: bool) -> OrchestratorState | None:
    """The state a run continues from: None (start at step 0), or with `resume` the newest published
    one; a run that does not resume refuses an `output_dir` holding an earlier run's batches."""
    if not resume:
        if published_steps(rollouts_root(output_dir)):
            raise RuntimeError(
                f"{output_dir} already holds batches of an earlier run; resume it (--resume) or pick a new output_dir"
            )
        return None
    state = load_resume_state(output_dir)
    if state is None:
        logger.info(f"--resume: no batch published under {rollouts_root(output_dir)} yet; starting at step 0")
        return None
    logger.info(
        f"resuming at step {state.step + 1} after the batch of step {state.step}; {len(state.pending)} pending group(s) dispatched again"
    )
    return state


def load_resume_state(output_dir: Path) -> OrchestratorState | None:
    """The state published with the newest batch (None: no batch yet), after dropping every
    output line of the steps after it."""
    steps = published_steps(rollouts_root(output_dir))
    state = None
    if steps:
        file = batch_dir(output_dir, steps[-1]) / STATE_FILE
        if not file.is_file():
            raise RuntimeError(
                f"{file} is missing: {batch_dir(output_dir, steps[-1])} was not written by this version's orchestrator"
            )
        state = OrchestratorState.model_validate_json(file.read_text())
    last = state.step if state is not None else -1
    _drop_later_rollouts(train_rollouts_file(output_dir), last, state.train_rollouts_bytes if state else 0)
    for step, file in sorted(eval_rollouts_files(output_dir).items()):
        if step > last:
            file.unlink()
            logger.info(f"removed {file}: evaluated after the last published batch (evaluated again if due)")
    return state


def _drop_later_rollouts(path: Path, last: int, size: int | None) -> None:
    """Leave `path` with the lines of steps <= `last` only: cut at the size recorded with the batch
    of step `last` (the orchestrator appends in step order), or filter line by line without one."""
    if size is None:
        dropped = filter_lines(path, lambda r: r.get("step", last + 1) <= last)
        if dropped:
            logger.info(f"{path}: dropped {dropped} line(s) of steps after {last} (rolled out again now)")
        return
    actual = path.stat().st_size if path.exists() else 0
    if actual > size:
        os.truncate(path, size)
        logger.info(f"{path}: cut {actual - size} bytes of steps after {last} (rolled out again now)")
    elif actual < size:
        logger.warning(
            f"{path}: {actual} bytes, but {size} were written when step {last} was published: "
            "rollout lines were lost (the file was cut or replaced); the batches are intact"
        )
