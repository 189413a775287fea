"""Causal attention kernels side by side: forward + backward time of one packed row, per kernel.

    python -m scripts.bench.attention_kernels                          # CUDA, bf16: Qwen3-0.6B's heads, 16k rows
    python -m scripts.bench.attention_kernels --lengths 2048x8 16384x1 --heads 16 --kv-heads 8

Guarantee: every candidate computes the same thing, causal attention within each sample of a
row (checked against the first candidate's output before timing); each is timed over the same
inputs with CUDA events after warm-up, forward and backward together, and a candidate a backend
cannot run is reported as such instead of failing the run. This is how the trainer's attention
choice (`src/envrl/trainer/model/attention.py`) is made; docs/gpu.md has the numbers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[int]], torch.Tensor]


def per_sample_sdpa(backend: SDPBackend | None, gqa: bool) -> Kernel:
    """One sdpa call per sample ([1, H, s, d]); kv heads repeated unless `gqa`."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        groups = q.shape[0] // k.shape[0]
        if not gqa and groups > 1:
            k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        outs, start = [], 0
        for n in lengths:
            part = [x[None, :, start : start + n] for x in (q, k, v)]
            extra = {"enable_gqa": True} if gqa and groups > 1 else {}
            if backend is None:
                outs.append(F.scaled_dot_product_attention(*part, is_causal=True, **extra)[0])
            else:
                with sdpa_kernel(backend):
                    outs.append(F.scaled_dot_product_attention(*part, is_causal=True, **extra)[0])
            start += n
        return torch.cat(outs, dim=1)

    return run


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """torch.nn.attention.varlen over the whole row, called as the trainer calls it."""
    from envrl.trainer.model.attention import _varlen_kernel_call
    from envrl.trainer.model.layout import varlen_layout

    (segment,) = varlen_layout(lengths, sdpa_from=sum(lengths) + 1).to(q.device).segments
    return _varlen_kernel_call(q, k, v, segment.cu_seqlens, segment.longest, None, q.shape[0] // k.shape[0])[
        0
    ].transpose(0, 1)


CANDIDATES: dict[str, Kernel] = {
    "sdpa default, gqa": per_sample_sdpa(None, True),
    "sdpa default, repeat kv": per_sample_sdpa(None, False),
    "sdpa cudnn, repeat kv": per_sample_sdpa(SDPBackend.CUDNN_ATTENTION, False),
    "sdpa cudnn, gqa": per_sample_sdpa(SDPBackend.CUDNN_ATTENTION, True),
    "sdpa flash, gqa": per_sample_sdpa(SDPBackend.FLASH_ATTENTION, True),
    "sdpa flash, repeat kv": per_sample_sdpa(SDPBackend.FLASH_ATTENTION, False),
    "sdpa efficient, repeat kv": per_sample_sdpa(SDPBackend.EFFICIENT_ATTENTION, False),
    "varlen (torch), repeat kv": varlen,
}


def time_ms(kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], reps: int) -> float:
    grad = torch.randn_like(q)
    for _ in range(3):
        torch.autograd.backward(kernel(q, k, v, lengths), grad)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.autograd.backward(kernel(q, k, v, lengths), grad)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", nargs="+", default=["16384x1", "8192x2", "4096x4", "2048x8", "512x32"])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_kernels: needs CUDA (the candidates are GPU kernels)")
    torch.manual_seed(0)
    for spec in args.lengths:
        length, count = (int(x) for x in spec.split("x"))
        lengths = [length] * count
        total = sum(lengths)
        q, k, v = (
            torch.randn(heads, total, args.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for heads in (args.heads, args.kv_heads, args.kv_heads)
        )
        flops = 6 * args.heads * args.head_dim * sum(n * (n + 1) for n in lengths)  # the trainer bench's count
        reference = None
        for name, kernel in CANDIDATES.items():
            try:
                with torch.no_grad():
                    out = kernel(q, k, v, lengths).float()
                if reference is None:
                    reference = out
                diff = (out - reference).abs().max().item()
                ms = time_ms(kernel, q, k, v, lengths, args.reps)
                row = {
                    "row": spec,
                    "kernel": name,
                    "ms": round(ms, 3),
                    "tflop/s": round(flops / ms / 1e9),
                    "max_diff": diff,
                }
            except RuntimeError as e:
                row = {"row": spec, "kernel": name, "error": str(e).splitlines()[0][:160]}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
