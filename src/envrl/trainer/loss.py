"""The policy-gradient loss as pure tensor functions: token weights carry the batch-wide normalisation, so summing
over micro-batches and ranks gives exactly the whole batch's loss, however packed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from envrl.trainer.config import LossConfig

LOGITS_CHUNK_ELEMENTS = 2**26
"""Logits scored at once (rows per chunk = this // vocab): 256 MB in fp32. At Qwen3's 151,936-token
vocabulary that is 441 rows, a GEMM large enough to keep a GPU busy, while one chunk's fp32
temporaries (scaled logits, log-softmax, in backward their gradient) stay near 1 GB."""


def row_chunks(total: int, vocab: int, chunk_elements: int = LOGITS_CHUNK_ELEMENTS) -> list[slice]:
    """Consecutive row slices covering `total` rows, each at most `chunk_elements // vocab` rows."""
    size = max(1, chunk_elements // vocab)
    return [slice(start, min(total, start + size)) for start in range(0, total, size)]


def chunk_scores(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `targets` [R] under each row of `logits` [R, V] divided by `temperature`
    [R], truncated like vLLM where `top_k` > 0 or `top_p` < 1 (top-k first, then the nucleus of
    what is left; the kept tokens renormalised), and the (detached) entropy of the
    temperature-scaled distribution before truncation, both fp32 [R]."""
    # bf16 / fp32 promotes to fp32 in one [R, V] allocation (`.float()` first would make two)
    scaled = logits / temperature.float().unsqueeze(-1)
    logp_all = F.log_softmax(scaled, dim=-1)
    picked = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    truncated = None if top_p is None or top_k is None else (top_p < 1) | (top_k > 0)
    if truncated is not None and truncated.any():
        rows = truncated.nonzero().squeeze(-1)
        kept = _kept_tokens(scaled[rows].detach(), top_p[rows], top_k[rows])
        log_mass = torch.logsumexp(logp_all[rows].masked_fill(~kept, float("-inf")), dim=-1)
        picked = picked.index_put((rows,), picked[rows] - log_mass)
    del scaled  # backward does not need it
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return picked, entropy


def token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each token under the distribution that sampled it, and its entropy,
    from a row's full logits (the trainer itself scores through `head.LogprobHead`, which never
    builds them).

    `logits` is [T, V] for tokens `input_ids` [T]; position t is scored by the logits at t - 1
    with token t's own sampling parameters (`chunk_scores`; `temperature`, `top_p`, `top_k` are
    [T]). Position 0 (which nothing predicts) gets logprob 0 and entropy 0. Scored
    `LOGITS_CHUNK_ELEMENTS` at a time, so the fp32 temporaries past the log-softmax that backward
    keeps are one chunk's.
    """
    targets, sampling = next_token_targets(input_ids, temperature, top_p, top_k)
    parts = [
        chunk_scores(logits[:-1][rows], targets[rows], *(None if t is None else t[rows] for t in sampling))
        for rows in row_chunks(logits.shape[0] - 1, logits.shape[-1])
    ]
    return with_first_position(torch.cat([p for p, _ in parts]), torch.cat([e for _, e in parts]))


def next_token_targets(
    input_ids: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None, top_k: torch.Tensor | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """What position t - 1 of a row predicts: token t and its sampling parameters (all [T - 1])."""
    return input_ids[1:], tuple(None if t is None else t[1:] for t in (temperature, top_p, top_k))


def with_first_position(picked: torch.Tensor, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T - 1] scores of positions 1.. -> [T], position 0 (which nothing predicts) scored 0."""
    zero = picked.new_zeros(1)
    return torch.cat([zero, picked]), torch.cat([zero, entropy])


def _kept_tokens(scaled: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: the tokens vLLM's top-k/top-p sampler keeps for each row of scaled logits.

    The same rule as vLLM's sampler: sort ascending, drop all below the k-th largest value (ties
    kept), then drop the tokens whose cumulative probability (of what is left) is <= 1 - p,
    always keeping the most likely one.
    """
    sorted_logits, order = scaled.sort(dim=-1)
    vocab = scaled.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).long()
    kth_largest = sorted_logits.gather(-1, (vocab - k).unsqueeze(-1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    dropped = cumulative <= (1 - top_p).unsqueeze(-1)
    dropped[:, -1] = False
    dropped |= sorted_logits == float("-inf")
    return torch.zeros_like(dropped).scatter(-1, order, ~dropped)


def policy_loss(
    logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    weights: torch.Tensor,
    config: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    lengths: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted policy-gradient loss over the tokens where `loss_mask` is true, and stat sums.

    Per token, with ratio r = exp(logp - logp_inf) and advantage A:
    loss = -r * A, or with PPO clipping max(-r * A, -clip(r, 1 - low, 1 + high) * A), plus
    `kl_coef * (exp(logp_inf - logp) - 1 - (logp_inf - logp))` (k3 KL to the inference policy),
    and with `ref_logprobs` (the frozen reference model's, [T]) `ref_kl_coef` times the same k3
    with `logp_ref` in place of `logp_inf` (KL to the reference; its sum is the `ref_kl` stat).
    With `ratio_mask = (low, high)`, tokens whose r is outside [low, high] contribute nothing (their
    weight is not redistributed). All tensors are [T]; `weights` carry the normalisation.
    A NaN inference logprob (a back-filled turn: the behaviour policy is unknown) counts as
    on-policy: ratio 1 and no mismatch. With `ratio_level = "sequence"` (GSPO) the log-ratio of
    every token is its sample's mean over trained tokens (samples of `lengths` tokens, in row
    order), so the ratio, its clipping and `ratio_mask` act per sample; the KL terms stay per token.
    """
    inference_logprobs = torch.where(torch.isnan(inference_logprobs), logprobs.detach(), inference_logprobs)
    keep, masked, mismatch_kl = _ratio_masked(logprobs, inference_logprobs, loss_mask, config, lengths)
    # Zeroed outside `keep`, so an extreme ratio on an untrained token cannot turn into a NaN grad.
    log_ratio = torch.where(keep, logprobs - inference_logprobs, 0.0)
    token_log_ratio = log_ratio
    if config.ratio_level == "sequence":
        log_ratio = torch.where(keep, _sample_mean(log_ratio, keep, _lengths(lengths, loss_mask)), 0.0)
    loss, clipped = _clipped_loss(torch.exp(log_ratio), advantages, keep, config)
    if config.kl_coef > 0:
        loss = loss + config.kl_coef * _k3(token_log_ratio)
    ref_kl = torch.zeros((), device=logprobs.device)
    if ref_logprobs is not None:
        ref_log_ratio = torch.where(keep, logprobs - ref_logprobs, 0.0)
        per_token_ref_kl = _k3(ref_log_ratio)
        loss = loss + config.ref_kl_coef * per_token_ref_kl
        ref_kl = torch.where(keep, per_token_ref_kl.detach(), 0.0).sum()
    total = (torch.where(keep, loss, 0.0) * weights).sum()
    stats = {
        "loss_tokens": loss_mask.sum().float(),
        "mismatch_kl": mismatch_kl,
        "clipped": clipped.sum().float(),
        "masked": masked.sum().float(),
        "ref_kl": ref_kl,
    }
    return total, stats


@torch.no_grad()
def _ratio_masked(
    logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig,
    lengths: tuple[int, ...] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens that train (`loss_mask` less those `ratio_mask` drops), those it drops, and the
    summed k3 mismatch KL to the inference policy over `loss_mask`."""
    true_log_ratio = logprobs - inference_logprobs
    mismatch_kl = torch.where(loss_mask, _k3(true_log_ratio), 0.0).sum()
    if config.ratio_mask is None:
        return loss_mask, torch.zeros_like(loss_mask), mismatch_kl
    masked_by = true_log_ratio
    if config.ratio_level == "sequence":
        masked_by = _sample_mean(true_log_ratio, loss_mask, _lengths(lengths, loss_mask))
    r = torch.exp(masked_by)
    low, high = config.ratio_mask
    masked = loss_mask & ((r < low) | (r > high))
    return loss_mask & ~masked, masked, mismatch_kl


def _clipped_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, keep: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token -r * A, PPO-clipped when `config.clip` is set, and the trained tokens the clip bound."""
    loss = -ratio * advantages
    if config.clip is False:
        return loss, torch.zeros_like(keep)
    low, high = config.clip
    clipped_loss = -torch.clamp(ratio, 1 - low, 1 + high) * advantages
    return torch.maximum(loss, clipped_loss), keep & (clipped_loss > loss)


def _lengths(lengths: tuple[int, ...] | None, loss_mask: torch.Tensor) -> tuple[int, ...]:
    """The row's sample lengths; without them the row is one sample."""
    return lengths if lengths is not None else (loss_mask.shape[0],)


def _sample_mean(values: torch.Tensor, mask: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    """[T]: each token gets the mean of `values` over its sample's `mask` tokens (0 where it has none)."""
    sample = torch.repeat_interleave(
        torch.arange(len(lengths), device=values.device), torch.tensor(lengths, device=values.device)
    )
    weights = mask.to(values.dtype)
    sums = values.new_zeros(len(lengths)).index_add(0, sample, values * weights)
    counts = values.new_zeros(len(lengths)).index_add(0, sample, weights)
    return (sums / counts.clamp(min=1))[sample]


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(train || inference) per token from log(p_train / p_inference)."""
    return torch.exp(-log_ratio) - 1 + log_ratio
