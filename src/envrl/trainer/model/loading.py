"""`load_shards`: every tensor of a meta-built, FSDP2-sharded model holds its checkpoint value (or its engine's
init), each rank reading only its own rows one bounded chunk at a time; anything else is a `LoadError` naming it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from loguru import logger
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, Shard

CHUNK_BYTES = 16 * 2**20
"""Most checkpoint bytes a rank reads (and keeps mapped) at once."""
INDEX_FILE = "model.safetensors.index.json"
PEFT_PREFIX = "base_model.model."
PEFT_BASE = ".base_layer"


class LoadError(RuntimeError):
    """The checkpoint files do not hold what the model needs; the message names the tensor and files."""


def model_files(name: str) -> Path:
    """The local directory of `model.name`: the path itself, or the hub snapshot in the HF cache."""
    path = Path(name)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"]))


def checkpoint_index(model_dir: Path) -> dict[str, Path]:
    """Each tensor name of the checkpoint in `model_dir` and the safetensors file holding it."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {tensor: model_dir / file for tensor, file in weight_map.items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise LoadError(f"no *.safetensors file in {model_dir}: the sharded trainer loads HF safetensors checkpoints")
    names: dict[str, Path] = {}
    for file in files:
        with safe_open(file, "pt") as f:
            names.update(dict.fromkeys(f.keys(), file))
    return names


def checkpoint_name(name: str) -> str:
    """The checkpoint's name of a model tensor (peft's wrapping names taken off)."""
    return name.removeprefix(PEFT_PREFIX).replace(PEFT_BASE, "")


def adapter_initial_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """LoRA adapters of a meta-device model initialised as peft does (A random, B zero) on the CPU,
    by name; the model stays on meta. Every rank draws the same values (same seed, same order)."""
    from peft.tuners.lora import LoraLayer

    values: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        adapters = [*module.lora_A.values(), *module.lora_B.values()]
        for adapter in adapters:
            adapter.to_empty(device="cpu")
        for name in module.lora_A:
            module.reset_lora_parameters(name, True)
        for name, tensor in module.named_parameters():
            if not name.startswith("base_layer."):
                values[f"{prefix}.{name}"] = tensor.detach().clone()
        for adapter in adapters:
            adapter.to("meta")
    return values


def shard_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The local tensor this rank fills and the first row of the full tensor it holds (FSDP2
    shards dim 0 as `torch.chunk` does: rank r holds rows from r * ceil(n / world) on)."""
    if not isinstance(tensor, DTensor):
        return tensor.data, 0
    if tuple(tensor.placements) != (Shard(0),):
        raise LoadError(f"expected an FSDP2 Shard(0) parameter, got placements {tensor.placements}")
    rows, world, rank = tensor.shape[0], tensor.device_mesh.size(), tensor.device_mesh.get_local_rank()
    return tensor.to_local(), min(rank * -(-rows // world), rows)


def read_rows(file: Path, name: str, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of tensor `name` in `file`, the file mapped only while they are read."""
    with safe_open(file, "pt") as f:
        return f.get_slice(name)[start:stop]


def fill_from_file(local: torch.Tensor, first_row: int, shape: torch.Size, file: Path, name: str) -> int:
    """Copy rows [first_row, first_row + len(local)) of `name` (a tensor of `shape`) into `local`,
    CHUNK_BYTES at a time; returns the bytes read."""
    with safe_open(file, "pt") as f:
        stored = f.get_slice(name).get_shape()
        if list(stored) != list(shape):
            raise LoadError(f"{file}: tensor {name} has shape {list(stored)}, the model needs {list(shape)}")
        if local.dim() == 0:
            local.copy_(f.get_tensor(name))
            return local.element_size()
    step = max(1, CHUNK_BYTES // max(1, local[0].numel() * local.element_size())) if len(local) else 1
    read = 0
    for offset in range(0, len(local), step):
        rows = read_rows(file, name, first_row + offset, first_row + min(offset + step, len(local)))
        local[offset : offset + len(rows)].copy_(rows)
        read += rows.numel() * rows.element_size()
    return read


def init_buffers(model: nn.Module) -> None:
    """Give every buffer the value the model's own initialisation computes (transformers'
    `_init_weights`: rotary `inv_freq` from the config); checkpoint buffers are read after."""
    init = getattr(model, "_init_weights", None)
    for module in model.modules():
        if module._buffers and not module._parameters and init is not None:
            init(module)


def load_shards(model: nn.Module, model_dir: Path, device: torch.device, shard: Callable[[nn.Module], None]) -> None:
    """Shard the meta-device `model` with `shard`, allocate this rank's shards on `device` and
    fill them: from the checkpoint in `model_dir`, LoRA adapters from their initial values."""
    initial = adapter_initial_values(model)
    index = checkpoint_index(model_dir)
    shard(model)
    model.to_empty(device=device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    init_buffers(base)
    persistent = set(model.state_dict())
    read = 0
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            local, first_row = shard_rows(tensor)
            if name in initial:
                local.copy_(initial[name][first_row : first_row + local.shape[0]])
                continue
            file = index.get(checkpoint_name(name))
            if file is not None and name in persistent:
                read += fill_from_file(local, first_row, tensor.shape, file, checkpoint_name(name))
            elif isinstance(tensor, nn.Parameter):
                raise LoadError(
                    f"parameter {name} (checkpoint name {checkpoint_name(name)}) is in none of the safetensors "
                    f"files of {model_dir}; the sharded trainer reads checkpoints whose tensor names match the "
                    "model's state dict (a plain HF safetensors save)"
                )
    logger.info(f"loaded this rank's shards from {model_dir}: {read / 1e6:.1f} MB read")
