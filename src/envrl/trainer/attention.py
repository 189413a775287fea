"""Document-masked attention for packed rows: each sample attends causally to itself only.

Guarantee: with `document_varlen` a packed row is one varlen kernel call over its cumulative
sample lengths (torch's `torch.nn.attention.varlen`, flash or cuDNN underneath; CUDA, bf16/fp16);
with `document_sdpa` it costs the sum over its samples of their own attention (padded only
within groups of similar length, never across samples). Neither builds a T×T mask, and each
token's output equals that of the sample run alone. `resolve_attn_implementation` turns the
config's choice into one that trains on the runtime's device and dtype, or says why it cannot.
Both run eagerly inside compiled decoder layers, so a row's layout never recompiles them.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

DOCUMENT_SDPA = "document_sdpa"
DOCUMENT_VARLEN = "document_varlen"
PADDING_SLACK = 2.0
"""A group of samples is padded to its longest while that costs at most this many times the
attention of the samples alone: one sdpa call per group instead of one per sample (on CPU, per
call overhead made 1.5-2 the fastest of 1, 1.5, 2, 4 on 16-2k-token mixes)."""


@dataclass(frozen=True)
class DocumentGroup:
    """Consecutive samples of a row, run as one padded [n, H, longest, d] sdpa call."""

    start: int
    """First token of the group in the row."""
    end: int
    gather: torch.Tensor | None
    """[n * longest] token indices into the group's slice (a padding slot repeats the sample's
    last token, which causality hides from every real query); None for a lone sample."""
    keep: torch.Tensor | None
    """[end - start] indices into the padded [n * longest] grid of the real tokens."""
    count: int
    longest: int


@dataclass(frozen=True)
class DocumentLayout:
    groups: tuple[DocumentGroup, ...]

    def to(self, device: torch.device) -> DocumentLayout:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return DocumentLayout(
            tuple(DocumentGroup(g.start, g.end, move(g.gather), move(g.keep), g.count, g.longest) for g in self.groups)
        )


def document_layout(lengths: Sequence[int], slack: float = PADDING_SLACK) -> DocumentLayout:
    """Group consecutive samples of lengths `lengths` (in row order) for `document_sdpa`."""
    runs: list[list[int]] = []
    for length in lengths:
        run = runs[-1] if runs else None
        if run is not None:
            longest = max(max(run), length)
            padded = (len(run) + 1) * longest**2
            if padded <= slack * (sum(n * n for n in run) + length * length):
                run.append(length)
                continue
        runs.append([length])
    groups = []
    start = 0
    for run in runs:
        end = start + sum(run)
        if len(run) == 1:
            groups.append(DocumentGroup(start, end, None, None, 1, run[0]))
        else:
            longest = max(run)
            gather, keep, offset = [], [], 0
            for i, length in enumerate(run):
                gather += [offset + min(j, length - 1) for j in range(longest)]
                keep += [i * longest + j for j in range(length)]
                offset += length
            groups.append(DocumentGroup(start, end, torch.tensor(gather), torch.tensor(keep), len(run), longest))
        start = end
    return DocumentLayout(tuple(groups))


def document_sdpa_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    document_layout: DocumentLayout | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: [B, H, T, d] inputs -> [B, T, H, d], causal per sample.

    Without `document_layout` each row is one sample. transformers builds no mask for this
    implementation, so a padding `attention_mask` is not applied: left-padded batches need `sdpa`.
    """
    if document_layout is not None and query.shape[0] != 1:
        raise ValueError(
            f"attn_implementation {DOCUMENT_SDPA!r}: a document_layout describes one packed row, "
            f"but the batch has {query.shape[0]} rows; pack them into one (envrl.trainer.packing.pack)"
        )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if document_layout is None:
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    return _document_attention(query[0], key[0], value[0], document_layout, dropout, scaling), None


@torch.compiler.disable
def _document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: DocumentLayout, dropout: float, scaling: float | None
) -> torch.Tensor:
    """[H, T, d] -> [1, T, H, d]; run eagerly inside a compiled layer (the compiled graph breaks
    here), so the row's layout (a Python structure that changes every micro-batch) never
    becomes a guard that recompiles the layer."""
    heads, _, dim = q.shape
    outputs = []
    for g in layout.groups:
        parts = [x[:, g.start : g.end] for x in (q, k, v)]
        if (
            g.gather is None
        ):  # 4-D: sdpa's flash/efficient kernels refuse 3-D inputs (the math kernel is far slower on CPU)
            lone = [x.unsqueeze(0) for x in parts]
            out = F.scaled_dot_product_attention(*lone, dropout_p=dropout, is_causal=True, scale=scaling)[0]
        else:
            padded = [x.index_select(1, g.gather).view(heads, g.count, g.longest, dim).transpose(0, 1) for x in parts]
            out = F.scaled_dot_product_attention(*padded, dropout_p=dropout, is_causal=True, scale=scaling)
            out = out.transpose(0, 1).reshape(heads, g.count * g.longest, dim).index_select(1, g.keep)
        outputs.append(out)
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return out.transpose(0, 1).unsqueeze(0).contiguous()


SDPA_FROM_TOKENS = 8192
"""A `document_varlen` row whose every sample is at least this long runs one sdpa call per sample
instead of one varlen call: for long samples sdpa's kernels (native GQA, no repeated kv heads)
beat torch's varlen kernel, for short packed ones the single varlen call wins
(`python -m scripts.bench.attention_kernels`; numbers in docs/gpu.md)."""


@dataclass(frozen=True)
class VarlenLayout:
    cu_seqlens: torch.Tensor
    """[samples + 1] int32: where each sample of the row starts, and the row's end."""
    lengths: tuple[int, ...]
    """Each sample's tokens, on the host (the choice of kernel needs no device sync)."""

    @property
    def longest(self) -> int:
        return max(self.lengths)

    def to(self, device: torch.device) -> VarlenLayout:
        return VarlenLayout(self.cu_seqlens.to(device), self.lengths)


def varlen_layout(lengths: Sequence[int]) -> VarlenLayout:
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    return VarlenLayout(torch.tensor(starts, dtype=torch.int32), tuple(lengths))


def _varlen_kernel() -> Callable[..., torch.Tensor] | None:
    """torch's varlen attention, where this torch has it (2.10+)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def document_varlen_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    document_layout: VarlenLayout | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: [1, H, T, d] inputs -> [1, T, H, d], causal per sample,
    one varlen kernel call for the whole row (without `document_layout` the row is one sample)."""
    if query.shape[0] != 1:
        raise ValueError(
            f"attn_implementation {DOCUMENT_VARLEN!r} takes one packed row, but the batch has {query.shape[0]} "
            "rows; pack them into one (envrl.trainer.packing.pack)"
        )
    if dropout:
        raise ValueError(f"attn_implementation {DOCUMENT_VARLEN!r} has no dropout (got {dropout}); train with 0")
    layout = document_layout or varlen_layout([query.shape[2]]).to(query.device)
    groups = getattr(module, "num_key_value_groups", 1)
    return _varlen_attention(query[0], key[0], value[0], layout, scaling, groups), None


@torch.compiler.disable
def _varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout, scaling: float | None, groups: int
) -> torch.Tensor:
    """[H, T, d] -> [1, T, H, d] through torch's varlen kernel ([T, H, d] layout, causal), or
    through one sdpa call per sample where every sample is long (`SDPA_FROM_TOKENS`)."""
    if min(layout.lengths) >= SDPA_FROM_TOKENS:
        return _per_sample_sdpa(q, k, v, layout.lengths, scaling, groups)
    return _varlen_kernel_call(q, k, v, layout, scaling, groups)


def _varlen_kernel_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout, scaling: float | None, groups: int
) -> torch.Tensor:
    """[H, T, d] -> [1, T, H, d]: one call of torch's varlen kernel over the row."""
    kernel = _varlen_kernel()
    params = inspect.signature(kernel).parameters
    gqa = groups > 1 and "enable_gqa" in params
    if groups > 1 and not gqa:
        k, v = repeat_kv(k.unsqueeze(0), groups)[0], repeat_kv(v.unsqueeze(0), groups)[0]
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    out = kernel(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        layout.cu_seqlens,
        layout.cu_seqlens,
        layout.longest,
        layout.longest,
        scale=scaling,
        **causal,
        **({"enable_gqa": True} if gqa else {}),
    )
    return out.unsqueeze(0)


def _per_sample_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], scaling: float | None, groups: int
) -> torch.Tensor:
    """[H, T, d] -> [1, T, H, d], one causal sdpa call per sample, kv heads shared (`enable_gqa`)."""
    outputs, start = [], 0
    for length in lengths:
        part = [x[None, :, start : start + length] for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*part, is_causal=True, scale=scaling, enable_gqa=groups > 1)
        outputs.append(out[0])
        start += length
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return out.transpose(0, 1).unsqueeze(0)


AttentionInterface.register(DOCUMENT_SDPA, document_sdpa_forward)
AttentionInterface.register(DOCUMENT_VARLEN, document_varlen_forward)


def resolve_attn_implementation(choice: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The attention transformers should use for training on `device` in `dtype` (`auto` picks
    the fastest document-masked one available: on CUDA in bf16/fp16 flash-attention's varlen
    kernel if flash-attn is installed, else torch's varlen kernel (`document_varlen`) where torch
    has it; otherwise `document_sdpa`)."""
    half = dtype in (torch.bfloat16, torch.float16)
    if choice == "auto":
        if device.type != "cuda" or not half:
            return DOCUMENT_SDPA
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        return DOCUMENT_VARLEN if _varlen_kernel() is not None else DOCUMENT_SDPA
    if choice == DOCUMENT_VARLEN and (device.type != "cuda" or not half or _varlen_kernel() is None):
        raise ValueError(
            f"trainer.attn_implementation = {DOCUMENT_VARLEN!r} needs CUDA, bf16/fp16 compute and "
            f"torch.nn.attention.varlen (torch 2.10+); here: {device.type}, {dtype}, torch {torch.__version__}. "
            "Use 'auto' (document_sdpa where varlen cannot run)"
        )
    if choice == "flex_attention" and device.type == "cpu":
        raise ValueError(
            "trainer.attn_implementation = 'flex_attention' cannot train on CPU (torch has no flex "
            "attention backward there); use 'auto' (document_sdpa) or 'sdpa'"
        )
    return choice
