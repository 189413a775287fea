"""The output head that scores the row's own tokens without materialising `[tokens, vocab]` logits.

Guarantee: with a request set, `LogprobHead` returns, for each position of the row, the
log-probability of the row's next token under the distribution that sampled it and that
distribution's entropy (what `loss.token_logprobs` returns from full logits), computed
`LOGITS_CHUNK_ELEMENTS` logits at a time in forward and recomputed chunk by chunk in backward:
peak memory above the hidden states is O(chunk × vocab), never O(tokens × vocab). Without a
request it is the `nn.Linear` it replaced (generation, SFT and any other caller see logits).
The head's weight is the same parameter (tied or not; state-dict names unchanged).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


class _ChunkedScores(torch.autograd.Function):
    """(hidden [R, D], weight [V, D], targets and sampling [R]) -> (logprob [R], entropy [R]).

    Forward keeps no logits; backward recomputes each chunk's logits and differentiates the
    same `chunk_scores` through autograd, so both passes share one definition of the arithmetic.
    The weight's gradient is one GEMM per chunk in the compute dtype (as the full-logits path's
    one GEMM), summed over chunks in fp32 and returned in the weight's dtype.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, top_p, top_k, chunk_elements):  # type: ignore[override]
        ctx.save_for_backward(hidden, weight, targets, temperature, top_p, top_k)
        ctx.chunks = row_chunks(hidden.shape[0], weight.shape[0], chunk_elements)
        picked, entropy = [], []
        for rows in ctx.chunks:
            p, e = chunk_scores(hidden[rows] @ weight.t(), targets[rows], *_sampling(rows, temperature, top_p, top_k))
            picked.append(p)
            entropy.append(e)
        entropy_out = torch.cat(entropy)
        ctx.mark_non_differentiable(entropy_out)
        return torch.cat(picked), entropy_out

    @staticmethod
    def backward(ctx, grad_picked, _grad_entropy):  # type: ignore[override]
        hidden, weight, targets, temperature, top_p, top_k = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        for rows in ctx.chunks:
            with torch.enable_grad():
                logits = (hidden[rows] @ weight.t()).requires_grad_()
                picked, _ = chunk_scores(logits, targets[rows], *_sampling(rows, temperature, top_p, top_k))
                (grad_logits,) = torch.autograd.grad(picked, logits, grad_picked[rows])
            if need_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if need_weight:
                grad_weight += grad_logits.t() @ hidden[rows]  # the GEMM in the compute dtype, summed in fp32
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _sampling(
    rows: slice, temperature: torch.Tensor, top_p: torch.Tensor | None, top_k: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    return temperature[rows], None if top_p is None else top_p[rows], None if top_k is None else top_k[rows]


def chunked_token_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    request: ScoreRequest,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`loss.token_logprobs(hidden @ weight.T, ...)` for one row's hidden states [T, D], chunked.

    Position t is scored by the hidden state at t - 1; position 0 gets logprob 0 and entropy 0.
    A row that fits one chunk is scored by plain autograd: its memory is one chunk's either way,
    and backward then needs no recompute of the logits (short rows, as on CPU, pay no extra GEMM).
    """
    targets, (temperature, top_p, top_k) = next_token_targets(
        request.input_ids, request.temperature, request.top_p, request.top_k
    )
    if len(row_chunks(targets.shape[0], weight.shape[0], chunk_elements)) == 1:
        picked, entropy = chunk_scores(hidden[:-1] @ weight.t(), targets, temperature, top_p, top_k)
    else:
        picked, entropy = _ChunkedScores.apply(hidden[:-1], weight, targets, temperature, top_p, top_k, chunk_elements)
    return with_first_position(picked, entropy)


class LogprobHead(nn.Linear):
    """An `nn.Linear` lm_head that, inside `scoring(request)`, returns [1, T, 2] (logprob,
    entropy) of the request's row instead of [1, T, V] logits. Installed by class swap
    (`install_logprob_head`), so the module keeps its parameter, name and hooks; the scores
    pass through the model's forward, where FSDP has the head's weight gathered for both passes."""

    request: ScoreRequest | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        request = self.request
        if request is None:
            return super().forward(hidden)
        if hidden.shape[0] != 1 or hidden.shape[1] != request.input_ids.shape[0]:
            raise ValueError(
                f"LogprobHead scores one packed row of {request.input_ids.shape[0]} tokens, but got hidden "
                f"states of shape {tuple(hidden.shape)}: call the model on that row with logits_to_keep = 0"
            )
        picked, entropy = chunked_token_scores(hidden[0], self.weight, request)
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
