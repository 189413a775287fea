"""The arithmetic of torch's varlen attention kernel (`torch.nn.attention.varlen.varlen_attn`,
CUDA only) on any device, so that `document_varlen`'s layouts can be checked on CPU.

Guarantee: `reference_varlen_attn` returns, for each sample between consecutive `cu_seq_q`
offsets, causal attention of its queries to its own keys, as the kernel does for samples whose
query and key lengths are equal (the only way `document_varlen` calls it). The kernel itself is
compared with `document_sdpa` on a GPU by `scripts/gpu/parity.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """[T, H, d] query, key and value (as many heads each) -> [T, H, d]."""
    if not torch.equal(cu_seq_q, cu_seq_k):
        raise ValueError("the reference covers equal query and key lengths only")
    bounds = cu_seq_q.tolist()
    outputs = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        q, k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
        outputs.append(out[0].transpose(0, 1))
    return torch.cat(outputs)
