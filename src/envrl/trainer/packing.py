"""Sequence packing: a batch of samples -> balanced micro-batches of at most `max_tokens` tokens.

Guarantee: every trainable sample lands in exactly one micro-batch, with position ids restarting
at 0 and its length recorded so attention never crosses samples; each token carries its
normalisation weight for the whole batch, and `shard` gives every rank the same number of
micro-batches (padding with inert ones), so ranks run the same collectives and their losses sum
to the whole batch's loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from loguru import logger
from torch import nn

from envrl.data.samples import TrainingSample
from envrl.trainer.attention import DOCUMENT_SDPA, DOCUMENT_VARLEN, document_layout, varlen_layout
from envrl.trainer.head import LogprobHead, ScoreRequest
from envrl.trainer.loss import token_logprobs


@dataclass(frozen=True)
class MicroBatch:
    """One packed row: all tensors are [T] except `input_ids`/`position_ids` ([1, T])."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    """Bool: trained on. False for a sample's first token, which nothing in the row predicts."""
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    """Per-token normalisation (1/N loss tokens, or 1/(samples * sample's loss tokens))."""
    temperature: torch.Tensor
    """Per-token sampling temperature (its sample's); top_p and top_k likewise."""
    top_p: torch.Tensor
    top_k: torch.Tensor
    lengths: tuple[int, ...]
    """Tokens of each sample, in row order: what document-masked attention keeps apart."""
    num_samples: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def to(self, device: torch.device) -> MicroBatch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return MicroBatch(**moved)


class BudgetKeys(NamedTuple):
    """The config keys a warning about the packing budget names, as the user sets them."""

    max_tokens: str
    """The key of the budget (`pack`'s `max_tokens`)."""
    seq_len: str
    """The key that bounds one sample's length."""


RL_KEYS = BudgetKeys("trainer.micro_batch_tokens", "orchestrator.seq_len")
"""`rl` and the standalone trainer."""
SFT_KEYS = BudgetKeys("micro_batch_tokens", "seq_len")
"""`rl sft` (its own config, envrl.trainer.sft)."""


def _trainable(sample: TrainingSample) -> int:
    """Loss tokens the trainer can score (a sample's first token has no prediction)."""
    return sum(sample.loss_mask[1:])


def balanced_bins(lengths: Sequence[int], max_tokens: int, multiple_of: int = 1) -> list[list[int]]:
    """Indices grouped into bins of total length <= max_tokens, filled greedily longest first
    into the emptiest bin so bins come out about equal; the bin count starts at the least the
    total allows, a multiple of `multiple_of` (so ranks get equal counts), and grows until every
    index fits. An index longer than max_tokens gets a bin of its own; empty bins are dropped.

    Within a bin indices are in decreasing length (what `document_layout` groups best); bins
    are returned largest first.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    count = max(1, -(-sum(lengths) // max_tokens))
    while True:
        count = -(-count // multiple_of) * multiple_of
        bins: list[list[int]] = [[] for _ in range(count)]
        loads = [0] * count
        for i in order:
            b = min(range(count), key=lambda b: (loads[b], b))
            if bins[b] and loads[b] + lengths[i] > max_tokens:
                break
            bins[b].append(i)
            loads[b] += lengths[i]
        else:
            filled = [b for b in range(count) if bins[b]]
            return [bins[b] for b in sorted(filled, key=lambda b: (-loads[b], b))]
        count += 1


def pack(
    samples: Sequence[TrainingSample],
    max_tokens: int,
    normalize: Literal["token", "sequence"],
    where: str = "the batch",
    multiple_of: int = 1,
    keys: BudgetKeys = RL_KEYS,
) -> list[MicroBatch]:
    """Pack the samples that have loss tokens; samples without any are left out (no gradient).

    The shape is picked from the batch (`balanced_bins`): about equal micro-batches of at most
    `max_tokens` tokens, as few as fit, their count a multiple of `multiple_of` (the number of
    ranks) when the batch has that many samples.

    A sample longer than `max_tokens` is trained in a row of its own (with a warning): the
    budget is a packing target, and `seq_len` is what bounds a sample; the warning names both
    as `keys` says (the user's keys for `max_tokens` and `seq_len`).
    """
    kept = [s for s in samples if _trainable(s) > 0]
    _warn_oversize(samples, max_tokens, where, keys)
    total_tokens = sum(_trainable(s) for s in kept)
    weight_of = {
        "token": lambda s: 1.0 / total_tokens,
        "sequence": lambda s: 1.0 / (len(kept) * _trainable(s)),
    }[normalize]
    micro_batches = []
    for indices in balanced_bins([len(s.input_ids) for s in kept], max_tokens, multiple_of):
        rows = [kept[i] for i in indices]
        positions = torch.cat([torch.arange(len(s.input_ids)) for s in rows])
        micro_batches.append(
            MicroBatch(
                input_ids=torch.tensor([t for s in rows for t in s.input_ids]).unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                loss_mask=torch.tensor([m for s in rows for m in s.loss_mask], dtype=torch.bool) & (positions > 0),
                inference_logprobs=torch.tensor([lp for s in rows for lp in s.inference_logprobs], dtype=torch.float32),
                advantages=torch.tensor([a for s in rows for a in s.token_advantages], dtype=torch.float32),
                weights=torch.tensor([weight_of(s) for s in rows for _ in s.input_ids], dtype=torch.float32),
                temperature=torch.tensor([s.temperature for s in rows for _ in s.input_ids], dtype=torch.float32),
                top_p=torch.tensor([s.top_p for s in rows for _ in s.input_ids], dtype=torch.float32),
                top_k=torch.tensor([s.top_k for s in rows for _ in s.input_ids], dtype=torch.long),
                lengths=tuple(len(s.input_ids) for s in rows),
                num_samples=len(rows),
            )
        )
    return micro_batches


def _warn_oversize(samples: Sequence[TrainingSample], max_tokens: int, where: str, keys: BudgetKeys) -> None:
    oversize = [(i, s) for i, s in enumerate(samples) if len(s.input_ids) > max_tokens]
    if oversize:
        i, s = max(oversize, key=lambda item: len(item[1].input_ids))
        logger.warning(
            f"{len(oversize)} sample(s) of {where} exceed {keys.max_tokens} = {max_tokens} and get a micro-batch "
            f"of their own (longest: sample {i}, env {s.env!r}, task {s.task_idx}, {len(s.input_ids)} tokens); "
            f"set {keys.seq_len} <= {keys.max_tokens} to bound them"
        )


def packed_logits(model: nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
    """[T, V] logits of a packed row, each sample attending only to itself.

    With `document_sdpa` / `document_varlen` the row's sample lengths go to the attention as
    `document_layout` (padded groups / cumulative lengths).
    Any other implementation gets the separation from position ids that restart at 0:
    transformers derives a block-diagonal mask from them (dense T×T for sdpa/eager, a block
    mask for flex, varlen for flash), but only without an attention mask and without a KV
    cache: `use_cache=False` is load-bearing.
    """
    extra = {}
    implementation = model.config._attn_implementation
    if implementation in (DOCUMENT_SDPA, DOCUMENT_VARLEN):
        layout = (document_layout if implementation == DOCUMENT_SDPA else varlen_layout)(micro_batch.lengths)
        extra["document_layout"] = layout.to(micro_batch.input_ids.device)
    out = model(input_ids=micro_batch.input_ids, position_ids=micro_batch.position_ids, use_cache=False, **extra)
    return out.logits[0]


def packed_token_logprobs(model: nn.Module, micro_batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] log-probability of each token of a packed row under the distribution that sampled it,
    and that distribution's entropy (`loss.token_logprobs`). Through the model's `LogprobHead`
    where it has one (`head.install_logprob_head`): no [T, V] logits are built; else from them."""
    mb = micro_batch
    head = model.get_output_embeddings()
    if not isinstance(head, LogprobHead):
        return token_logprobs(packed_logits(model, mb), mb.input_ids[0], mb.temperature, mb.top_p, mb.top_k)
    with head.scoring(ScoreRequest(mb.input_ids[0], mb.temperature, mb.top_p, mb.top_k)):
        scores = packed_logits(model, mb)
    return scores[:, 0], scores[:, 1]


def inert_micro_batch(pad_token_id: int) -> MicroBatch:
    """A one-token row with no loss tokens: runs forward/backward (FSDP collectives), adds nothing."""
    return MicroBatch(
        input_ids=torch.tensor([[pad_token_id]]),
        position_ids=torch.zeros(1, 1, dtype=torch.long),
        loss_mask=torch.zeros(1, dtype=torch.bool),
        inference_logprobs=torch.zeros(1),
        advantages=torch.zeros(1),
        weights=torch.zeros(1),
        temperature=torch.ones(1),
        top_p=torch.ones(1),
        top_k=torch.zeros(1, dtype=torch.long),
        lengths=(1,),
        num_samples=0,
    )


def shard(micro_batches: Sequence[MicroBatch], rank: int, world_size: int, pad_token_id: int) -> list[MicroBatch]:
    """This rank's micro-batches: round-robin over the (size-sorted) list, padded with inert rows
    so that every rank gets the same count, and at least one."""
    count = max(1, -(-len(micro_batches) // world_size))
    padded = list(micro_batches) + [inert_micro_batch(pad_token_id)] * (count * world_size - len(micro_batches))
    return padded[rank::world_size]
