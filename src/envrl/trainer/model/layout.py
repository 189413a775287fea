"""How a packed row's samples group into attention kernel calls: every token of a row is in exactly one group or
segment, and none attends across samples."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
    prefix: slice | None = None
    """Row slice of the prefix these samples share (`Document.suffixes`): every query also
    attends to all of its keys. None: the samples stand alone."""

    def shifted(self, offset: int) -> DocumentGroup:
        """The same group in a row whose tokens start `offset` later (its indices are relative)."""
        prefix = None if self.prefix is None else slice(self.prefix.start + offset, self.prefix.stop + offset)
        return DocumentGroup(
            self.start + offset, self.end + offset, self.gather, self.keep, self.count, self.longest, prefix
        )

    def to(self, device: torch.device) -> DocumentGroup:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return DocumentGroup(
            self.start, self.end, move(self.gather), move(self.keep), self.count, self.longest, self.prefix
        )


@dataclass(frozen=True)
class Document:
    """Tokens of a packed row that attend only to one another: a sample of `prefix` tokens
    (`suffixes` empty), or a prefix that several samples share followed by each one's own
    tokens (`suffixes`, in row order), which attend to the whole prefix and causally to
    themselves, with positions that continue the prefix's."""

    prefix: int
    suffixes: tuple[int, ...] = ()

    @property
    def length(self) -> int:
        """Tokens in the row."""
        return self.prefix + sum(self.suffixes)

    @property
    def sample_lengths(self) -> tuple[int, ...]:
        """Tokens of each sample it holds (the prefix counts in each)."""
        return tuple(self.prefix + s for s in self.suffixes) or (self.prefix,)


@dataclass(frozen=True)
class DocumentLayout:
    groups: tuple[DocumentGroup, ...]

    def to(self, device: torch.device) -> DocumentLayout:
        return DocumentLayout(tuple(g.to(device) for g in self.groups))


def _padded_runs(lengths: Sequence[int], slack: float) -> list[list[int]]:
    """Consecutive lengths grouped while padding each group to its longest costs at most `slack`
    times the attention of its members alone."""
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
    return runs


def _group(start: int, run: Sequence[int], prefix: slice | None = None) -> DocumentGroup:
    end = start + sum(run)
    if len(run) == 1:
        return DocumentGroup(start, end, None, None, 1, run[0], prefix)
    longest = max(run)
    gather, keep, offset = [], [], 0
    for i, length in enumerate(run):
        gather += [offset + min(j, length - 1) for j in range(longest)]
        keep += [i * longest + j for j in range(length)]
        offset += length
    return DocumentGroup(start, end, torch.tensor(gather), torch.tensor(keep), len(run), longest, prefix)


def document_layout(documents: Sequence[int | Document], slack: float = PADDING_SLACK) -> DocumentLayout:
    """Group the consecutive documents of a row (a bare length is a one-sample `Document`) for
    `document_sdpa`: runs of lone samples of similar length share a call; a shared prefix is its
    own call, then its suffixes in runs of similar length, each run one call."""
    groups: list[DocumentGroup] = []
    start = 0
    lone: list[int] = []

    def close_lone() -> None:
        nonlocal start
        for run in _padded_runs(lone, slack):
            groups.append(_group(start, run))
            start += sum(run)
        lone.clear()

    for document in documents:
        document = document if isinstance(document, Document) else Document(document)
        if not document.suffixes:
            lone.append(document.prefix)
            continue
        close_lone()
        prefix = slice(start, start + document.prefix)
        groups.append(_group(start, [document.prefix]))
        start = prefix.stop
        for run in _padded_runs(document.suffixes, slack):
            groups.append(_group(start, run, prefix))
            start += sum(run)
    close_lone()
    return DocumentLayout(tuple(groups))


SDPA_FROM_TOKENS = 4096
"""In a `document_varlen` row a sample at least this long runs as its own sdpa call (native GQA:
no repeated kv heads; cuDNN's Hopper kernel where sdpa picks it), and each run of shorter
samples between them as one varlen kernel call: per sample, sdpa won from 4k tokens and the
single varlen call up to 2k (`python -m scripts.bench.attention_kernels`; numbers in docs/gpu.md)."""


@dataclass(frozen=True)
class VarlenSegment:
    """Consecutive tokens of a row run by one kernel call: one long sample (`cu_seqlens` None,
    sdpa) or a run of short samples (one varlen call over their cumulative lengths)."""

    start: int
    end: int
    cu_seqlens: torch.Tensor | None
    """[samples + 1] int32, from the segment's start; None for a lone long sample."""
    longest: int

    def to(self, device: torch.device) -> VarlenSegment:
        cu_seqlens = None if self.cu_seqlens is None else self.cu_seqlens.to(device)
        return VarlenSegment(self.start, self.end, cu_seqlens, self.longest)


@dataclass(frozen=True)
class VarlenLayout:
    segments: tuple[VarlenSegment | DocumentGroup, ...]
    """In row order; a `DocumentGroup` is a run of suffixes after the prefix they share."""

    def to(self, device: torch.device) -> VarlenLayout:
        return VarlenLayout(tuple(s.to(device) for s in self.segments))


def varlen_layout(
    documents: Sequence[int | Document], sdpa_from: int = SDPA_FROM_TOKENS, slack: float = PADDING_SLACK
) -> VarlenLayout:
    """Split a row of documents (in row order; a bare length is a one-sample `Document`) into
    segments: samples as `VarlenSegment`s, a shared prefix as one more sample, then its suffixes
    in runs of similar length (`document_layout`'s grouping), each a `DocumentGroup`."""
    segments: list[VarlenSegment | DocumentGroup] = []
    run: list[int] = []
    start = 0

    def close_run() -> None:
        if run:
            cu = torch.tensor([0, *itertools.accumulate(run)], dtype=torch.int32)
            segments.append(VarlenSegment(start - sum(run), start, cu, max(run)))
            run.clear()

    for document in documents:
        document = document if isinstance(document, Document) else Document(document)
        length = document.prefix
        if length >= sdpa_from:
            close_run()
            segments.append(VarlenSegment(start, start + length, None, length))
        else:
            run.append(length)
        start += length
        if document.suffixes:
            close_run()
            prefix = slice(start - length, start)
            for suffixes in _padded_runs(document.suffixes, slack):
                segments.append(_group(start, suffixes, prefix))
                start += sum(suffixes)
    close_run()
    return VarlenLayout(tuple(segments))
