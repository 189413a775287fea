"""What a run keeps on disk: batch `step_<n>` is deleted only once a checkpoint newer than n exists, never the
newest; without a checkpoint every batch is kept."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loguru import logger

from envrl.data.layout import batch_dir, checkpoints_root, published_steps, rollouts_root

BatchRetention = Literal["checkpoints", "all"]
"""`checkpoints`: delete the batches older than the oldest kept checkpoint; `all`: keep every batch."""

LOW_DISK_BYTES = 2 * 1024**3
"""Below this much free space on the run's filesystem every step warns (a checkpoint or a batch
that cannot be written stops the run)."""


def prune_batches(output_dir: Path) -> list[int]:
    """Delete the batches no resume can read again; returns their steps."""
    checkpoints = published_steps(checkpoints_root(output_dir))
    batches = published_steps(rollouts_root(output_dir))
    if not checkpoints or not batches:
        return []
    oldest_needed = min(checkpoints[0], batches[-1])
    pruned = [step for step in batches if step < oldest_needed]
    for step in pruned:
        shutil.rmtree(batch_dir(output_dir, step), ignore_errors=True)
    if pruned:
        logger.debug(f"deleted batches {pruned[0]}..{pruned[-1]}: older than checkpoint {checkpoints[0]}")
    return pruned


@dataclass(frozen=True)
class DiskUse:
    """Bytes the run directory holds and bytes free on its filesystem."""

    run_bytes: int
    free_bytes: int

    @property
    def low(self) -> bool:
        return self.free_bytes < LOW_DISK_BYTES

    def describe(self) -> str:
        return f"disk {_gib(self.run_bytes)} (free {_gib(self.free_bytes)})"


def disk_use(output_dir: Path) -> DiskUse:
    """The run directory's size (files only, links not followed) and its filesystem's free space."""
    return DiskUse(run_bytes=_tree_bytes(Path(output_dir)), free_bytes=shutil.disk_usage(output_dir).free)


def _tree_bytes(root: Path) -> int:
    total = 0
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # deleted while we walked (a pruned batch, an old checkpoint)
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"
