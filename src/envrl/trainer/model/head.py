"""`LogprobHead`: each position's logprob of the next token under its sampling distribution, and its entropy,
computed chunk by chunk, never materialising `[tokens, vocab]` logits; without a request, the `nn.Linear` it
replaced."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch
from torch import nn

from envrl.trainer.loss import LOGITS_CHUNK_ELEMENTS, chunk_scores, next_token_targets, row_chunks, with_first_position


@dataclass(frozen=True)
class ScoreRequest:
    """What the head scores: the row's token ids and each token's sampling parameters, all [T]."""

    input_ids: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None


def plain_chunk_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprob of `targets`, logsumexp, entropy), fp32 [R], of logits [R, V] / temperature [R]
    where nothing is truncated: what `loss.chunk_scores` gives, plus the logsumexp its
    gradient needs, without keeping a [R, V] tensor (compiled, it reads the logits once)."""
    scaled = logits.float() / temperature.float().unsqueeze(-1)
    lse = torch.logsumexp(scaled, dim=-1)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (torch.exp(scaled - lse.unsqueeze(-1)) * scaled).sum(-1)
    return picked, lse, entropy


def plain_chunk_grad(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """d(sum grad * logprob of targets)/d logits, in the logits' dtype: (onehot - softmax) *
    grad / temperature per row, the gradient autograd derives from `plain_chunk_stats`."""
    temperature = temperature.float().unsqueeze(-1)
    probs = torch.exp(logits.float() / temperature - lse.unsqueeze(-1))
    onehot = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)
    return ((onehot.float() - probs) * (grad.unsqueeze(-1) / temperature)).to(logits.dtype)


@dataclass(frozen=True)
class ScoreKernels:
    """The per-chunk arithmetic of untruncated rows, eager or compiled (`compiled_kernels`)."""

    stats: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = plain_chunk_stats
    grad: Callable[..., torch.Tensor] = plain_chunk_grad


EAGER_KERNELS = ScoreKernels()


@cache
def compiled_kernels() -> ScoreKernels:
    """Both kernels compiled once with dynamic row counts (a row's last chunk is shorter): each
    becomes a fused reduction / elementwise pass over the chunk's logits."""
    return ScoreKernels(
        torch.compile(plain_chunk_stats, dynamic=True, fullgraph=True),
        torch.compile(plain_chunk_grad, dynamic=True, fullgraph=True),
    )


def _accumulate_weight_grad(total: torch.Tensor, grad_logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """`total` (fp32 [V, D]) + grad_logits.T @ hidden, the GEMM in the compute dtype: on CUDA
    one GEMM accumulating into fp32 (`out_dtype`; in place where this torch allows it: a copy
    of `total` per chunk cost 22 ms of a 0.77 s step at Qwen3-0.6B 16k); in fp32 compute one
    in-place GEMM; elsewhere a GEMM then an fp32 add."""
    if total.dtype == grad_logits.dtype:
        return total.addmm_(grad_logits.t(), hidden)
    mode = _fp32_accumulation(total.device) if grad_logits.is_cuda else None
    if mode == "in_place":
        return torch.addmm(total, grad_logits.t(), hidden, out_dtype=total.dtype, out=total)
    if mode == "new":
        return torch.addmm(total, grad_logits.t(), hidden, out_dtype=total.dtype)
    return total.add_(grad_logits.t() @ hidden)


@cache
def _fp32_accumulation(device: torch.device) -> str | None:
    """How this torch's CUDA addmm accumulates half inputs into fp32 (`out_dtype`, 2.8+): "in_place"
    (`out=` the accumulator), "new" (a fresh output), or None; probed once on a 2x2 product."""
    a = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
    total = torch.full((2, 2), 1.0, device=device)
    try:
        torch.addmm(total, a, a, out_dtype=torch.float32, out=total)
        if torch.equal(total, torch.full_like(total, 3.0)):
            return "in_place"
    except (RuntimeError, TypeError):
        pass
    try:
        torch.addmm(total, a, a, out_dtype=torch.float32)
    except (RuntimeError, TypeError):
        return None
    return "new"


class _ChunkedScores(torch.autograd.Function):
    """(hidden [R, D], weight [V, D], targets and sampling [R]) -> (logprob [R], entropy [R]).

    Forward keeps no logits (except for a row of one chunk, whose logits are that chunk's
    memory either way) and only each untruncated row's logsumexp; backward recomputes each
    chunk's logits with one GEMM and turns them into their gradient with `kernels.grad`. A chunk
    holding a row truncated by top-k/top-p is scored by `loss.chunk_scores` and differentiated
    through autograd instead. The weight's gradient is one GEMM per chunk in the compute dtype
    (as the full-logits path's one GEMM), summed over chunks in fp32 and returned in the
    weight's dtype.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, top_p, top_k, chunk_elements, kernels):  # type: ignore[override]
        ctx.chunks = row_chunks(hidden.shape[0], weight.shape[0], chunk_elements)
        ctx.kernels = kernels
        ctx.truncated = _truncated_chunks(ctx.chunks, top_p, top_k)
        picked, entropy, lse, kept = [], [], [], None
        for rows, truncated in zip(ctx.chunks, ctx.truncated, strict=True):
            logits = hidden[rows] @ weight.t()
            if truncated:
                p, e = chunk_scores(logits, targets[rows], *_sampling(rows, temperature, top_p, top_k))
                chunk_lse = torch.zeros_like(p)
            else:
                p, chunk_lse, e = kernels.stats(logits, targets[rows], temperature[rows])
            picked.append(p)
            entropy.append(e)
            lse.append(chunk_lse)
            if len(ctx.chunks) == 1:
                kept = logits
        ctx.save_for_backward(hidden, weight, targets, temperature, top_p, top_k, torch.cat(lse), kept)
        entropy_out = torch.cat(entropy)
        ctx.mark_non_differentiable(entropy_out)
        return torch.cat(picked), entropy_out

    @staticmethod
    def backward(ctx, grad_picked, _grad_entropy):  # type: ignore[override]
        hidden, weight, targets, temperature, top_p, top_k, lse, kept = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        for rows, truncated in zip(ctx.chunks, ctx.truncated, strict=True):
            logits = kept if kept is not None else hidden[rows] @ weight.t()
            if truncated:
                with torch.enable_grad():
                    logits = logits.detach().requires_grad_()
                    picked, _ = chunk_scores(logits, targets[rows], *_sampling(rows, temperature, top_p, top_k))
                    (grad_logits,) = torch.autograd.grad(picked, logits, grad_picked[rows])
            else:
                grad_logits = ctx.kernels.grad(logits, targets[rows], temperature[rows], lse[rows], grad_picked[rows])
            if need_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if need_weight:
                grad_weight = _accumulate_weight_grad(grad_weight, grad_logits, hidden[rows])
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _truncated_chunks(chunks: list[slice], top_p: torch.Tensor | None, top_k: torch.Tensor | None) -> list[bool]:
    """Which chunks hold a row sampled with top-k or top-p (one host sync per row, none per chunk)."""
    if top_p is None or top_k is None:
        return [False] * len(chunks)
    truncated = (top_p < 1) | (top_k > 0)
    if not bool(truncated.any()):
        return [False] * len(chunks)
    flags = truncated.tolist()
    return [any(flags[rows]) for rows in chunks]


def _sampling(
    rows: slice, temperature: torch.Tensor, top_p: torch.Tensor | None, top_k: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    return temperature[rows], None if top_p is None else top_p[rows], None if top_k is None else top_k[rows]


def chunked_token_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    request: ScoreRequest,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
    kernels: ScoreKernels = EAGER_KERNELS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`loss.token_logprobs(hidden @ weight.T, ...)` for one row's hidden states [T, D], chunked.

    Position t is scored by the hidden state at t - 1; position 0 gets logprob 0 and entropy 0.
    """
    targets, (temperature, top_p, top_k) = next_token_targets(
        request.input_ids, request.temperature, request.top_p, request.top_k
    )
    picked, entropy = _ChunkedScores.apply(
        hidden[:-1], weight, targets, temperature, top_p, top_k, chunk_elements, kernels
    )
    return with_first_position(picked, entropy)


class LogprobHead(nn.Linear):
    """An `nn.Linear` lm_head that, inside `scoring(request)`, returns [1, T, 2] (logprob,
    entropy) of the request's row instead of [1, T, V] logits. Installed by class swap
    (`install_logprob_head`), so the module keeps its parameter, name and hooks; the scores
    pass through the model's forward, where FSDP has the head's weight gathered for both passes."""

    request: ScoreRequest | None = None
    kernels: ScoreKernels = EAGER_KERNELS
    """Compiled with the decoder layers (`compile.compile_layers`), else eager."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        request = self.request
        if request is None:
            return super().forward(hidden)
        if hidden.shape[0] != 1 or hidden.shape[1] != request.input_ids.shape[0]:
            raise ValueError(
                f"LogprobHead scores one packed row of {request.input_ids.shape[0]} tokens, but got hidden "
                f"states of shape {tuple(hidden.shape)}: call the model on that row with logits_to_keep = 0"
            )
        picked, entropy = chunked_token_scores(hidden[0], self.weight, request, kernels=self.kernels)
        return torch.stack([picked.unsqueeze(0), entropy.unsqueeze(0)], dim=-1)  # a new tensor, not a view

    @contextmanager
    def scoring(self, request: ScoreRequest) -> Iterator[None]:
        self.request = request
        try:
            yield
        finally:
            self.request = None


def install_logprob_head(model: nn.Module) -> bool:
    """Turn the model's lm_head into a `LogprobHead` where it is a plain bias-free `nn.Linear`
    (a LoRA-wrapped head keeps the full-logits path); returns whether it did."""
    head = model.get_output_embeddings()
    if type(head) is nn.Linear and head.bias is None:
        head.__class__ = LogprobHead
    return isinstance(head, LogprobHead)
