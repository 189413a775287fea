"""`plan_recompute`, pure: no layer recomputed when every layer's activations fit the free memory, else every k-th
with the largest k that fits, else all; the plan's reason is logged (the estimate: docs/trainer.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from loguru import logger
from torch import nn

from envrl.trainer.loss import LOGITS_CHUNK_ELEMENTS
from envrl.trainer.model.compile import decoder_layers

RecomputeChoice = Literal["auto"] | bool

OPTIMIZER_BYTES_PER_PARAM = 12
"""fp32 gradient + AdamW's exp_avg and exp_avg_sq, allocated at the first step."""
HEAD_BYTES = 4 * 4 * LOGITS_CHUNK_ELEMENTS
"""The logits path's peak above the hidden states: one chunk's fp32 logits, log-softmax,
gradient and product (`head.py`)."""
MARGIN = 0.10
"""Fraction of the free memory left for fragmentation and whatever the estimate misses."""


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int

    @classmethod
    def of(cls, config: object) -> LayerShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.hidden_size, config.intermediate_size, heads, kv_heads, head_dim, config.num_hidden_layers)

    def saved_per_token(self) -> int:
        """Elements one layer keeps for backward per token (the module docstring's sum)."""
        d, hd = self.hidden, self.head_dim
        return 4 * d + 2 * (self.heads + 2 * self.kv_heads) * hd + 2 * self.heads * hd + 4 * self.intermediate


@dataclass(frozen=True)
class RecomputePlan:
    every: int
    """0: no layer recomputed; k >= 1: layers 0, k, 2k, ... recomputed (1: all)."""
    reason: str

    def checkpointed(self, layers: int) -> list[int]:
        return [] if self.every == 0 else list(range(0, layers, self.every))


def plan_recompute(
    choice: RecomputeChoice,
    shape: LayerShape,
    row_tokens: int,
    dtype_bytes: int,
    free_bytes: int,
    local_params: int,
) -> RecomputePlan:
    """Which layers to recompute for rows of `row_tokens` with `free_bytes` free now (module docstring)."""
    if choice is not True and choice is not False and choice != "auto":
        raise ValueError(f"trainer.activation_checkpointing = {choice!r}: use 'auto', true or false")
    layers = shape.layers
    if choice is True:
        return RecomputePlan(1, "trainer.activation_checkpointing = true: every decoder layer recomputed")
    if choice is False:
        return RecomputePlan(0, "trainer.activation_checkpointing = false: no layer recomputed")
    gib = 2**30
    full = shape.saved_per_token() * row_tokens * dtype_bytes
    kept = shape.hidden * row_tokens * dtype_bytes
    budget = free_bytes * (1 - MARGIN) - OPTIMIZER_BYTES_PER_PARAM * local_params - HEAD_BYTES
    what = (
        f"activations {full / gib:.2f} GiB per layer at {row_tokens} tokens ({layers} layers: "
        f"{layers * full / gib:.1f} GiB), budget {budget / gib:.1f} GiB of {free_bytes / gib:.1f} GiB free"
    )
    if layers * full <= budget:
        return RecomputePlan(0, f"activation_checkpointing = 'auto': no layer recomputed ({what})")
    for every in range(layers, 1, -1):  # fewest recomputed layers first
        recomputed = len(range(0, layers, every))
        if (layers - recomputed) * full + recomputed * kept + full <= budget:
            return RecomputePlan(
                every,
                f"activation_checkpointing = 'auto': layers 0, {every}, {2 * every}, ... recomputed, "
                f"{recomputed} of {layers} ({what})",
            )
    return RecomputePlan(1, f"activation_checkpointing = 'auto': every layer recomputed ({what})")


def free_memory(device: torch.device) -> int:
    """Bytes free for this process's tensors now: CUDA's free memory, or MemAvailable on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def local_trainable_params(model: nn.Module) -> int:
    """Trainable parameters this rank holds (its shards when FSDP-sharded)."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad)
    return sum(t.numel() for t in local)


def apply_recompute(model: nn.Module, plan: RecomputePlan) -> None:
    """Checkpoint the plan's layers (HF's non-reentrant per-layer checkpointing), no others."""
    logger.info(plan.reason)
    if plan.every == 0:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    chosen = set(plan.checkpointed(len(decoder_layers(model))))
    for i, layer in enumerate(decoder_layers(model)):
        layer.gradient_checkpointing = i in chosen
