"""Packing: every trainable sample lands in exactly one micro-batch of at most `max_tokens`, attention never crosses
samples, every rank gets the same number of micro-batches, and a shared prefix is held once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import torch
from loguru import logger
from torch import nn

from envrl.data.samples import TrainingSample
from envrl.trainer.loss import token_logprobs
from envrl.trainer.model.attention import DOCUMENT_SDPA, DOCUMENT_VARLEN
from envrl.trainer.model.head import LogprobHead, ScoreRequest
from envrl.trainer.model.layout import Document, document_layout, varlen_layout


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
    documents: tuple[Document, ...]
    """The row's documents in row order: what document-masked attention keeps apart."""
    num_samples: int

    @property
    def lengths(self) -> tuple[int, ...]:
        """Row tokens of each sample, in row order, a shared prefix counted in its first sample's:
        the segments a per-sample statistic of the loss (`loss.policy_loss`) is taken over."""
        segments: list[int] = []
        for d in self.documents:
            segments += [d.prefix + d.suffixes[0], *d.suffixes[1:]] if d.suffixes else [d.prefix]
        return tuple(segments)

    @property
    def sample_tokens(self) -> int:
        """Tokens of the samples it trains, a shared prefix counted in each (>= `num_tokens`)."""
        return sum(sum(d.sample_lengths) for d in self.documents)

    @property
    def num_tokens(self) -> int:
        """Tokens in the row: what the model computes."""
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
"""`rl sft` (its own config, envrl.trainer.sft.main)."""


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


MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not shared: a shared prefix costs one more attention call and
splits the row's padded groups, which a handful of tokens saved does not pay for."""


def _first_trained(sample: TrainingSample) -> int:
    """Index of the first token the trainer scores (>= 1; the sample has one)."""
    return next(i for i, m in enumerate(sample.loss_mask) if i > 0 and m)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def shared_prefix_groups(samples: Sequence[TrainingSample], max_tokens: int) -> list[tuple[int, list[int]]]:
    """(shared prefix length, sample indices): samples in lexicographic order of their tokens,
    consecutive ones grouped while the tokens the group saves ((members - 1) x prefix) do not
    fall and its row (prefix + each member's rest) fits `max_tokens`; 0 for a sample alone.
    Groups come in the order of their first sample, so a batch with nothing to share packs as
    it would without sharing.

    A prefix ends before every member's first trained token, so each member's rest starts with
    an untrained token: the row position before it (another sample's, or the prefix's last)
    predicts nothing that is trained.
    """
    order = sorted(range(len(samples)), key=lambda i: samples[i].input_ids)
    limits = [_first_trained(s) - 1 for s in samples]  # the longest prefix each sample can share
    groups: list[tuple[int, list[int]]] = []
    for i in order:
        ids = samples[i].input_ids
        if groups:
            prefix, members = groups[-1]
            if len(members) == 1:
                prefix = limits[members[0]]
            shared = _common_prefix(samples[members[-1]].input_ids, ids, min(limits[i], prefix))
            n = len(members)
            row = sum(len(samples[m].input_ids) for m in members) + len(ids) - n * shared
            if shared >= MIN_SHARED_PREFIX and n * shared >= (n - 1) * prefix and row <= max_tokens:
                groups[-1] = (shared, [*members, i])
                continue
        groups.append((0, [i]))
    return sorted(groups, key=lambda group: min(group[1]))


def pack(
    samples: Sequence[TrainingSample],
    max_tokens: int,
    normalize: Literal["token", "sequence"],
    where: str = "the batch",
    multiple_of: int = 1,
    keys: BudgetKeys = RL_KEYS,
    share_prefixes: bool = False,
) -> list[MicroBatch]:
    """Pack the samples that have loss tokens; samples without any are left out (no gradient).

    The shape is picked from the batch (`balanced_bins`): about equal micro-batches of at most
    `max_tokens` tokens, as few as fit, their count a multiple of `multiple_of` (the number of
    ranks) when the batch has that many samples.

    A sample longer than `max_tokens` is trained in a row of its own (with a warning): the
    budget is a packing target, and `seq_len` is what bounds a sample; the warning names both
    as `keys` says (the user's keys for `max_tokens` and `seq_len`).

    `share_prefixes` (for `document_sdpa` and `document_varlen`, which run a `Document`'s shared prefix): a group
    of `shared_prefix_groups` becomes one document, no larger than a rank's share of the batch.
    """
    kept = [s for s in samples if _trainable(s) > 0]
    _warn_oversize(samples, max_tokens, where, keys)
    total_tokens = sum(_trainable(s) for s in kept)
    weight_of = {
        "token": lambda s: 1.0 / total_tokens,
        "sequence": lambda s: 1.0 / (len(kept) * _trainable(s)),
    }[normalize]
    if share_prefixes:
        rank_share = -(-sum(len(s.input_ids) for s in kept) // multiple_of)
        groups = shared_prefix_groups(kept, min(max_tokens, rank_share))
    else:
        groups = [(0, [i]) for i in range(len(kept))]
    documents = [_document(kept, prefix, members) for prefix, members in groups]
    return [
        _micro_batch(kept, [groups[g] for g in indices], tuple(documents[g] for g in indices), weight_of)
        for indices in balanced_bins([d.length for d in documents], max_tokens, multiple_of)
    ]


def _micro_batch(
    kept: Sequence[TrainingSample],
    groups: Sequence[tuple[int, list[int]]],
    documents: tuple[Document, ...],
    weight_of: Callable[[TrainingSample], float],
) -> MicroBatch:
    """One packed row of `groups` (a shared prefix's length and its members' indices into `kept`), in order."""
    pieces = []  # (sample, first token, last token + 1) in row order
    for prefix, members in groups:
        if prefix:
            pieces.append((kept[members[0]], 0, prefix))
        pieces += [(kept[m], prefix, len(kept[m].input_ids)) for m in members]
    positions = torch.cat([torch.arange(a, b) for _, a, b in pieces])
    per_token = partial(_per_token, pieces)
    return MicroBatch(
        input_ids=per_token(lambda s: s.input_ids, torch.long).unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        loss_mask=per_token(lambda s: s.loss_mask, torch.bool) & (positions > 0),
        inference_logprobs=per_token(lambda s: s.inference_logprobs, torch.float32),
        advantages=per_token(lambda s: s.token_advantages, torch.float32),
        weights=per_token(lambda s: [weight_of(s)] * len(s.input_ids), torch.float32),
        temperature=per_token(lambda s: [s.temperature] * len(s.input_ids), torch.float32),
        top_p=per_token(lambda s: [s.top_p] * len(s.input_ids), torch.float32),
        top_k=per_token(lambda s: [s.top_k] * len(s.input_ids), torch.long),
        documents=documents,
        num_samples=sum(len(members) for _, members in groups),
    )


def _per_token(
    pieces: Sequence[tuple[TrainingSample, int, int]],
    values: Callable[[TrainingSample], Sequence[float]],
    dtype: torch.dtype,
) -> torch.Tensor:
    """[T]: `values` of each piece's sample, over the piece's tokens, in row order."""
    return torch.tensor([v for s, a, b in pieces for v in values(s)[a:b]], dtype=dtype)


def _document(samples: Sequence[TrainingSample], prefix: int, members: Sequence[int]) -> Document:
    if not prefix:
        (only,) = members
        return Document(len(samples[only].input_ids))
    return Document(prefix, tuple(len(samples[m].input_ids) - prefix for m in members))


def _warn_oversize(samples: Sequence[TrainingSample], max_tokens: int, where: str, keys: BudgetKeys) -> None:
    oversize = [(i, s) for i, s in enumerate(samples) if len(s.input_ids) > max_tokens]
    if oversize:
        i, s = max(oversize, key=lambda item: len(item[1].input_ids))
        logger.warning(
            f"{len(oversize)} sample(s) of {where} exceed {keys.max_tokens} = {max_tokens} and get a micro-batch "
            f"of their own (longest: sample {i}, env {s.env!r}, task {s.task_idx}, {len(s.input_ids)} tokens); "
            f"set {keys.seq_len} <= {keys.max_tokens} to bound them"
        )


def shares_prefixes(model: nn.Module, choice: Literal["auto"] | bool = "auto") -> bool:
    """Whether to pack `model`'s rows with shared prefixes (`trainer.share_prefixes` = `choice`):
    never where its attention cannot run them (only `document_sdpa` and `document_varlen` can),
    `auto` with `document_sdpa`, where it was measured to pay (docs/trainer.md), and `true`
    wherever it can."""
    implementation = model.config._attn_implementation
    if choice is False or implementation not in (DOCUMENT_SDPA, DOCUMENT_VARLEN):
        return False
    return choice is True or implementation == DOCUMENT_SDPA


def packed_logits(model: nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
    """[T, V] logits of a packed row, each sample attending only to itself.

    With `document_sdpa` the row's `documents` go to the attention as `document_layout` (padded
    groups, a shared prefix and the suffixes that read it); with `document_varlen` as
    `varlen_layout` (cumulative lengths of runs of samples, and the same suffix groups).
    Any other implementation gets the separation from position ids that restart at 0:
    transformers derives a block-diagonal mask from them (dense T×T for sdpa/eager, a block
    mask for flex, varlen for flash), but only without an attention mask and without a KV
    cache: `use_cache=False` is load-bearing.
    """
    extra = {}
    implementation = model.config._attn_implementation
    if implementation in (DOCUMENT_SDPA, DOCUMENT_VARLEN):
        layout = (document_layout if implementation == DOCUMENT_SDPA else varlen_layout)(micro_batch.documents)
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
        documents=(Document(1),),
        num_samples=0,
    )


def shard(micro_batches: Sequence[MicroBatch], rank: int, world_size: int, pad_token_id: int) -> list[MicroBatch]:
    """This rank's micro-batches: round-robin over the (size-sorted) list, padded with inert rows
    so that every rank gets the same count, and at least one."""
    count = max(1, -(-len(micro_batches) // world_size))
    padded = list(micro_batches) + [inert_micro_batch(pad_token_id)] * (count * world_size - len(micro_batches))
    return padded[rank::world_size]
