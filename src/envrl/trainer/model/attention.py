"""Document-masked attention for packed rows: each token's output equals that of its sample run alone (a shared
prefix computed once), never with a T×T mask; `resolve_attn_implementation` picks one that trains here or says why
not."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

from envrl.trainer.model.layout import DocumentGroup, DocumentLayout, VarlenLayout, varlen_layout

DOCUMENT_SDPA = "document_sdpa"
DOCUMENT_VARLEN = "document_varlen"


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
    outputs = [_group_attention(q, k, v, g, dropout, scaling) for g in layout.groups]
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return out.transpose(0, 1).unsqueeze(0).contiguous()


def _group_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: DocumentGroup,
    dropout: float,
    scaling: float | None,
    kv_groups: int = 1,
) -> torch.Tensor:
    """[H, T, d] queries, [H / kv_groups, T, d] keys and values of a row -> [H, g.end - g.start, d]:
    the group's samples, one sdpa call, after their shared prefix where the group has one (each
    kv head repeated for its `kv_groups` query heads, on the group's tokens only)."""
    heads, _, dim = q.shape
    if kv_groups > 1:
        rows = slice(g.prefix.start if g.prefix is not None else g.start, g.end)
        k, v = (x[:, rows].repeat_interleave(kv_groups, 0) for x in (k, v))
        q, g = q[:, rows], g.shifted(-rows.start)
    parts = [x[:, g.start : g.end] for x in (q, k, v)]
    # 4-D: sdpa's flash/efficient kernels refuse 3-D inputs (the math kernel is far slower on CPU)
    if g.gather is None:
        batch = [x.unsqueeze(0) for x in parts]
    else:
        batch = [x.index_select(1, g.gather).view(heads, g.count, g.longest, dim).transpose(0, 1) for x in parts]
    if g.prefix is None:
        out = F.scaled_dot_product_attention(*batch, dropout_p=dropout, is_causal=True, scale=scaling)
    else:
        out = _after_prefix(*batch, k[:, g.prefix], v[:, g.prefix], dropout, scaling)
    if g.gather is None:
        return out[0]
    return out.transpose(0, 1).reshape(heads, g.count * g.longest, dim).index_select(1, g.keep)


def _after_prefix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """[n, H, L, d] suffixes (padded at their ends) after a shared [H, p, d] prefix: each query
    sees the whole prefix and its own suffix up to itself (causal, aligned at the bottom right).
    The prefix's keys and values are expanded, not copied per suffix, so their gradient is the
    sum over the suffixes that read them."""
    count, _, length, _ = q.shape
    p = prefix_k.shape[1]
    keys = torch.cat([prefix_k.unsqueeze(0).expand(count, -1, -1, -1), k], dim=2)
    values = torch.cat([prefix_v.unsqueeze(0).expand(count, -1, -1, -1), v], dim=2)
    visible = torch.ones(length, p + length, dtype=torch.bool, device=q.device).tril(diagonal=p)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, dropout_p=dropout, scale=scaling)


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
    """[H, T, d] -> [1, T, H, d], one kernel call per segment of the layout: a long sample
    through sdpa, a run of short ones through torch's varlen kernel, a run of suffixes through
    `document_sdpa`'s masked call after their prefix (kv heads repeated for it)."""
    outputs = []
    for segment in layout.segments:
        if isinstance(segment, DocumentGroup):
            out = _group_attention(q, k, v, segment, 0.0, scaling, kv_groups=groups)
            outputs.append(out.transpose(0, 1).unsqueeze(0))
            continue
        parts = [x[:, segment.start : segment.end] for x in (q, k, v)]
        if segment.cu_seqlens is None:
            outputs.append(_sample_sdpa(*parts, scaling, groups))
        else:
            outputs.append(_varlen_kernel_call(*parts, segment.cu_seqlens, segment.longest, scaling, groups))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def _varlen_kernel_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    longest: int,
    scaling: float | None,
    groups: int,
) -> torch.Tensor:
    """[H, T, d] -> [1, T, H, d]: one call of torch's varlen kernel over samples at `cu_seqlens`."""
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
        cu_seqlens,
        cu_seqlens,
        longest,
        longest,
        scale=scaling,
        **causal,
        **({"enable_gqa": True} if gqa else {}),
    )
    return out.unsqueeze(0)


def _sample_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float | None, groups: int) -> torch.Tensor:
    """[H, T, d] of one sample -> [1, T, H, d], causal sdpa with kv heads shared (`enable_gqa`)."""
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], is_causal=True, scale=scaling, enable_gqa=groups > 1
    )
    return out[0].transpose(0, 1).unsqueeze(0)


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
