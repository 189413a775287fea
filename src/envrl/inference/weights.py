"""Checks that a directory of HF safetensors can replace the served weights.

Guarantee: `check_replacement` reads only safetensors headers (no tensor data) and raises
`WeightsError` naming the directory and the first problems found unless the new directory holds
exactly the served checkpoint's tensor names with the same shapes, so a bad reload is refused
before the running engine is touched.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

Shapes = dict[str, tuple[int, ...]]

MAX_HEADER_BYTES = 100 * 1024 * 1024
SHOWN = 5


class WeightsError(ValueError):
    """A weights directory that cannot replace the served weights; the message says why."""


def read_shapes(directory: Path) -> Shapes:
    """Tensor name -> shape for every tensor in `directory`/*.safetensors."""
    if not directory.is_dir():
        raise WeightsError(f"weights directory {directory} does not exist (or is not a directory)")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(
            f"no *.safetensors files in {directory}; expected HF safetensors weights written by the trainer"
        )
    shapes: Shapes = {}
    for file in files:
        for name, shape in _header_shapes(file).items():
            if name in shapes:
                raise WeightsError(f"tensor {name!r} appears in more than one file of {directory}")
            shapes[name] = shape
    return shapes


def _header_shapes(file: Path) -> Shapes:
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER_BYTES:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(f.read(length))
        return {name: tuple(info["shape"]) for name, info in header.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise WeightsError(f"{file} is not a readable safetensors file: {type(e).__name__}: {e}") from None


def check_replacement(new_dir: Path, served: Shapes) -> None:
    """Raise WeightsError unless `new_dir` has exactly the tensors of `served`, shape for shape."""
    check_shapes(read_shapes(new_dir), served, str(new_dir))


def check_shapes(new: Shapes, served: Shapes, where: str) -> None:
    """Raise WeightsError naming `where` unless `new` has exactly the tensors of `served`."""
    problems: list[str] = []
    if missing := sorted(served.keys() - new.keys()):
        problems.append(f"missing tensors {_few(missing)}")
    if unexpected := sorted(new.keys() - served.keys()):
        problems.append(f"unexpected tensors {_few(unexpected)}")
    mismatched = [
        f"{name} {list(new[name])} (served: {list(served[name])})"
        for name in sorted(served.keys() & new.keys())
        if new[name] != served[name]
    ]
    if mismatched:
        problems.append(f"shape mismatch: {_few(mismatched)}")
    if problems:
        raise WeightsError(f"weights in {where} do not fit the served model: {'; '.join(problems)}")


def _few(items: list[str]) -> str:
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more
