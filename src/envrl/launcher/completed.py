"""`completed_run(rl)`: before anything starts, the one line saying a `--resume` would start at or past `max_steps`
(and how to train further), else None."""

from __future__ import annotations

from envrl.data import layout
from envrl.launcher.config import RLConfig


def completed_run(rl: RLConfig) -> str | None:
    """The line for a resume of a run that has nothing left to train, else None."""
    if not rl.resume:
        return None
    start = rl.trainer.ckpt.resume_step
    if start is None:
        checkpoints = layout.published_steps(layout.checkpoints_root(rl.output_dir))
        start = checkpoints[-1] if checkpoints else 0
    if start < rl.max_steps:
        return None
    return (
        f"rl: the run in {rl.output_dir} is complete: its checkpoint is at step {start} and max_steps is "
        f"{rl.max_steps}, so nothing was started; to train it further, resume with a larger --max-steps "
        f"(rl --resume --output-dir {rl.output_dir} --max-steps {start + rl.max_steps})"
    )
