"""The run directory's layout: where each process finds what another one published.

Guarantee: every path under `<output_dir>` that crosses a process boundary is named here once;
a `step_<n>` directory exists only when complete (writers rename it into place).
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP_DIR = re.compile(r"step_(\d+)")


def batch_dir(output_dir: Path, step: int) -> Path:
    """Where trainer step `step` reads its samples: `<output_dir>/rollouts/step_<step>/`."""
    return Path(output_dir) / "rollouts" / f"step_{step}"


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    """The trainer's full state after `step` completed steps: `<output_dir>/checkpoints/step_<step>/`."""
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def weights_dir(output_dir: Path, step: int) -> Path:
    """Where policy `step` is published: `<output_dir>/weights/step_<step>/`."""
    return Path(output_dir) / "weights" / f"step_{step}"


def published_steps(root: Path) -> list[int]:
    """Steps of the complete `step_<n>` directories under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir())
