"""Weights as files: `write_policy` makes `weights/step_<k>/` appear only complete, as HF safetensors with the
base's names and dtype; a replica's `check_shapes` refuses a mismatch with `WeightsError` before the engine is
touched."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envrl.runtime.atomic import atomic_dir

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

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


def write_policy(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    target: Path,
    base_config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Publish `target` holding `state` (the model's full state) as the base checkpoint holds it."""
    dtype = export_dtype(base_config)
    state = _realias_tied(model, {name: tensor.to(dtype) for name, tensor in state.items()})
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp, state_dict=state)
        base_config.save_pretrained(tmp)  # the live config says fp32 and use_cache=False
        tokenizer.save_pretrained(tmp)


def _realias_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make tied parameters (e.g. lm_head and embed_tokens) one tensor object again.

    Gathering FSDP shards or casting copies them apart, and HF's save_pretrained recognises tied
    weights by shared storage: without this the file would hold an extra `lm_head.weight` that
    the base checkpoint (and so the inference server) does not have.
    """
    canonical: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first = canonical.setdefault(id(param), name)
        if first != name and first in state and name in state:
            state[name] = state[first]
    return state


def export_dtype(base_config: PretrainedConfig) -> torch.dtype:
    """The dtype the base checkpoint was saved in (fp32 if it does not say)."""
    import torch  # here, not at the top: the orchestrator reads weights directories without torch

    dtype = getattr(base_config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


async def reload_files(engine: Any, path: Path) -> None:
    """Reload the weights in `path` in place on every worker of vLLM's `engine` (vLLM's
    `reload_weights` through envrl's worker extension, envrl.inference.worker)."""
    await engine.collective_rpc("envrl_reload_weights", args=(str(path),))
