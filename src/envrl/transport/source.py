"""`transport_of(path)` and `read_source(path)`, the only readers of a policy directory's layout: a `WeightSource`
saying how it travels and what loading it needs, or a `WeightsError` naming what is wrong."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envrl.transport.files import Shapes, WeightsError, read_shapes
from envrl.transport.transfer_files import TRANSFER_FILE, TransferInfo, read_transfer

ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a weights directory a PEFT LoRA adapter instead of a full model."""

Transport = Literal["files", "adapter", "memory"]


@dataclass(frozen=True)
class FileWeights:
    """HF safetensors (the filesystem transport): reloaded in place."""

    path: Path
    shapes: Shapes
    step: int | None = None


@dataclass(frozen=True)
class AdapterWeights:
    """A PEFT LoRA adapter, hot-loaded onto the base model."""

    path: Path
    rank: int
    step: int | None = None


@dataclass(frozen=True)
class MemoryWeights:
    """A policy the trainer sends in memory (`transfer.json`)."""

    path: Path
    info: TransferInfo
    step: int | None = None


WeightSource = FileWeights | AdapterWeights | MemoryWeights
"""A policy directory, parsed; `step`: the policy step the caller loads it as (None: unlabelled)."""


def transport_of(path: Path) -> Transport:
    """How the policy in `path` travels, from its file names alone."""
    if (path / TRANSFER_FILE).is_file():
        return "memory"
    if (path / ADAPTER_CONFIG).is_file():
        return "adapter"
    return "files"


def read_source(path: Path, step: int | None = None) -> WeightSource:
    """The policy in `path`, to be loaded as policy `step`; WeightsError naming what is unreadable."""
    match transport_of(path):
        case "memory":
            try:
                return MemoryWeights(path, read_transfer(path), step)
            except ValueError as e:
                raise WeightsError(str(e)) from None
        case "adapter":
            return AdapterWeights(path, _adapter_rank(path / ADAPTER_CONFIG), step)
        case "files":
            return FileWeights(path, read_shapes(path), step)


def _adapter_rank(file: Path) -> int:
    try:
        return int(json.loads(file.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WeightsError(f"{file} is not a readable PEFT adapter config: {e}") from None
