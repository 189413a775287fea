"""After `patch_cpu_lora()`, vLLM-CPU's LoRA ops compute exactly `out[t] = x[t] @ W[idx[t]].T` as one matrix product
per adapter slot; only the float32 summation order differs (why and numbers: docs/trainer.md)."""

from __future__ import annotations

import os

import torch

STOCK_ENV = "ENVRL_STOCK_CPU_LORA"
"""Set (to anything) in the inference server's environment to keep vLLM's own ops, e.g. to
measure the difference (`scripts/bench/lora_generation.py --stock`)."""


def lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, out]: row t is `inputs[t] @ weights[indices[t]].T`, one product per distinct slot.

    `weights` is [slots, out, in] or [slots, 1, out, in] (vLLM's stacked adapters)."""
    inputs = inputs.to(dtype)
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    slots = torch.unique(indices)
    if slots.numel() == 1:
        return inputs @ weights[slots[0]].to(dtype).T
    out = inputs.new_empty(inputs.shape[0], weights.shape[1])
    for slot in slots.tolist():
        rows = (indices == slot).nonzero().squeeze(1)
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def patch_cpu_lora() -> None:
    """Route vLLM's CPU LoRA ops (direct calls and the `sgmv_*` wrappers) through the functions
    above, unless `STOCK_ENV` is set."""
    if os.environ.get(STOCK_ENV):
        return
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (lora_ops, punica_cpu):
        module.bgmv_expand = bgmv_expand
        module.bgmv_shrink = bgmv_shrink
        module.bgmv_expand_slice = bgmv_expand_slice
