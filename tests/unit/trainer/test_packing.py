"""Packing: every sample exactly once, no attention across samples, batch-wide normalisation."""

import importlib.util
from itertools import pairwise

import pytest
import torch
from loguru import logger
from transformers import AutoModelForCausalLM

import envrl.trainer.model.attention as attention
from envrl.data.samples import TrainingSample
from envrl.trainer.model.attention import (
    DOCUMENT_SDPA,
    DOCUMENT_VARLEN,
    _document_attention,
    _varlen_attention,
    resolve_attn_implementation,
)
from envrl.trainer.model.layout import SDPA_FROM_TOKENS, Document, DocumentGroup, document_layout, varlen_layout
from envrl.trainer.packing import RL_KEYS, SFT_KEYS, BudgetKeys, balanced_bins, pack, packed_logits, shard
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.varlen_reference import reference_varlen_attn


def sample(prompt: int, completion: int, first_id: int = 5) -> TrainingSample:
    n = prompt + completion
    return TrainingSample(
        input_ids=list(range(first_id, first_id + n)),
        loss_mask=[0] * prompt + [1] * completion,
        inference_logprobs=[0.0] * prompt + [-1.0] * completion,
        advantage=1.0,
        env="e",
        task_idx=0,
        policy_step=0,
    )


def test_bins_respect_the_budget_and_hold_every_index_once():
    lengths = [7, 3, 9, 1, 4, 4, 10, 2]
    bins = balanced_bins(lengths, max_tokens=10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # 40 tokens in bins of 10: filled longest first into the emptiest, they pack tight


def test_bins_come_out_about_equal_and_longest_first_within_each():
    lengths = [30, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]
    bins = balanced_bins(lengths, max_tokens=50)
    assert sorted(sum(lengths[i] for i in b) for b in bins) == [40, 40]  # first-fit would give 50 + 30
    assert all(lengths[b[j]] >= lengths[b[j + 1]] for b in bins for j in range(len(b) - 1))


def test_bin_count_is_a_multiple_of_the_ranks_when_the_batch_fills_that_many():
    lengths = [6] * 10
    assert len(balanced_bins(lengths, max_tokens=30, multiple_of=4)) == 4
    assert len(balanced_bins(lengths, max_tokens=30)) == 2
    assert len(balanced_bins([6, 6], max_tokens=30, multiple_of=4)) == 2  # no empty bins


def test_positions_restart_per_sample_and_first_tokens_are_not_trained():
    micro_batches = pack([sample(2, 3), sample(1, 2, first_id=50)], max_tokens=16, normalize="token")
    assert len(micro_batches) == 1
    mb = micro_batches[0]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 50, 51, 52]]
    assert mb.loss_mask.tolist() == [False, False, True, True, True, False, True, True]


def test_token_normalisation_weights_each_loss_token_equally_across_micro_batches():
    micro_batches = pack([sample(1, 2), sample(1, 4, first_id=40)], max_tokens=5, normalize="token")
    assert len(micro_batches) == 2
    weights = torch.cat([mb.weights[mb.loss_mask] for mb in micro_batches])
    assert torch.allclose(weights, torch.full((6,), 1 / 6))


def test_sequence_normalisation_averages_each_sample_then_the_samples():
    micro_batches = pack([sample(1, 2), sample(1, 4, first_id=40)], max_tokens=16, normalize="sequence")
    mb = micro_batches[0]
    weights = mb.weights[mb.loss_mask].tolist()
    # sorted longest first: the 4-token sample then the 2-token one
    assert weights == pytest.approx([1 / 8] * 4 + [1 / 4] * 2)


def test_samples_without_loss_tokens_are_left_out():
    micro_batches = pack([sample(3, 0), sample(1, 2)], max_tokens=16, normalize="token")
    assert sum(mb.num_samples for mb in micro_batches) == 1


def test_a_sample_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    micro_batches = pack(
        [sample(1, 2), sample(4, 8), sample(2, 2)], max_tokens=10, normalize="token", where="rollouts/step_3"
    )
    assert sorted(mb.num_tokens for mb in micro_batches) == [7, 12]
    assert sum(mb.num_samples for mb in micro_batches) == 3


@pytest.mark.parametrize(
    ("keys", "advice"),
    [
        (RL_KEYS, "set orchestrator.seq_len <= trainer.micro_batch_tokens"),
        (SFT_KEYS, "exceed micro_batch_tokens = 10"),
    ],
)
def test_the_oversize_warning_names_the_keys_of_the_command_that_packs(keys: BudgetKeys, advice: str) -> None:
    warned: list[str] = []
    sink = logger.add(lambda m: warned.append(str(m)), level="WARNING", format="{message}")
    try:
        pack([sample(4, 8)], max_tokens=10, normalize="token", where="SFT step 1", keys=keys)
    finally:
        logger.remove(sink)
    (warning,) = warned
    assert advice in warning
    if keys == SFT_KEYS:  # `rl sft` has no trainer or orchestrator section to point at
        assert "trainer." not in warning and "orchestrator." not in warning and "set seq_len <=" in warning


def test_each_token_carries_its_samples_sampling_parameters():
    hot = sample(1, 2).model_copy(update={"temperature": 1.5, "top_p": 0.9, "top_k": 7})
    (mb,) = pack([hot, sample(1, 1, first_id=40)], max_tokens=16, normalize="token")
    assert mb.temperature.tolist() == [1.5, 1.5, 1.5, 1.0, 1.0]
    assert mb.top_p.tolist() == pytest.approx([0.9] * 3 + [1.0] * 2)
    assert mb.top_k.tolist() == [7, 7, 7, 0, 0]


def test_each_token_carries_its_own_advantage():
    samples = synthetic_samples(3)
    samples[1] = samples[1].model_copy(
        update={"token_advantages": [0.5 * i * m for i, m in enumerate(samples[1].loss_mask)]}
    )
    (mb,) = pack(samples, max_tokens=10_000, normalize="token")
    # the row holds the samples in some order: compare the multiset of (token, advantage) pairs
    packed = sorted(zip(mb.input_ids[0].tolist(), mb.advantages.tolist(), strict=True))
    expected = sorted((t, a) for s in samples for t, a in zip(s.input_ids, s.token_advantages, strict=True))
    assert packed == expected  # multiples of 0.5 below 2^24 are exact in float32


def test_every_rank_gets_the_same_number_of_micro_batches():
    micro_batches = pack(synthetic_samples(7, seed=1), max_tokens=48, normalize="token")
    shards = [shard(micro_batches, rank, 3, pad_token_id=0) for rank in range(3)]
    assert len({len(s) for s in shards}) == 1
    assert sum(mb.num_samples for s in shards for mb in s) == 7
    assert all(not mb.loss_mask.any() for s in shards for mb in s if mb.num_samples == 0)


def mixed_lengths_samples() -> list[TrainingSample]:
    """Lengths that `document_sdpa` runs both as padded groups and as a lone sample."""
    samples = synthetic_samples(7, seed=2) + synthetic_samples(1, prompt_len=(90, 90), seed=3)
    (mb,) = pack(samples, max_tokens=4096, normalize="token")
    counts = [g.count for g in document_layout(mb.lengths).groups]
    assert 1 in counts and max(counts) > 1, counts
    return samples


@pytest.mark.parametrize("attn_implementation", [DOCUMENT_SDPA, "sdpa", "eager"])
def test_packed_forward_matches_separate_forwards(attn_implementation):
    model = AutoModelForCausalLM.from_pretrained(
        DEFAULT_DIR, dtype=torch.float32, attn_implementation=attn_implementation
    ).eval()
    (mb,) = pack(mixed_lengths_samples(), max_tokens=4096, normalize="token")
    with torch.no_grad():
        packed = packed_logits(model, mb)
        starts = (mb.position_ids[0] == 0).nonzero().flatten().tolist() + [mb.num_tokens]
        for start, end in pairwise(starts):
            alone = model(input_ids=mb.input_ids[:, start:end]).logits[0]
            assert torch.allclose(packed[start:end], alone, atol=1e-5)


def test_document_attention_gradients_match_separate_backwards():
    """Padding inside a group must add nothing: grads of the packed loss equal the sum of each
    sample's own (fp32, summed over 8 samples: agreement to 1e-5 of the largest grad)."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32, attn_implementation=DOCUMENT_SDPA)
    (mb,) = pack(mixed_lengths_samples(), max_tokens=4096, normalize="token")
    packed_logits(model, mb).logsumexp(-1).sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for row in mb.input_ids[0].split(list(mb.lengths)):
        model(input_ids=row.unsqueeze(0)).logits[0].logsumexp(-1).sum().backward()
    for name, param in model.named_parameters():
        scale = param.grad.abs().max().item()
        assert torch.allclose(packed[name], param.grad, atol=1e-5 * scale, rtol=0), name


def test_auto_attention_is_document_masked_and_flex_is_refused_on_cpu():
    assert resolve_attn_implementation("auto", torch.device("cpu")) == DOCUMENT_SDPA
    assert resolve_attn_implementation("sdpa", torch.device("cpu")) == "sdpa"
    with pytest.raises(ValueError, match="flex_attention.*cannot train on CPU"):
        resolve_attn_implementation("flex_attention", torch.device("cpu"))


def test_document_attention_runs_on_sdpas_flash_kernel_for_groups_and_lone_samples():
    """sdpa's fused kernels take 4-D inputs only; anything else falls back to the math kernel,
    which materialises each sample's T×T scores (8x slower on CPU at 2k tokens, and at 16k
    tokens on a GPU gigabytes per layer). Restricted to the flash kernel, a fallback raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32, attn_implementation=DOCUMENT_SDPA)
    (mb,) = pack(mixed_lengths_samples(), max_tokens=4096, normalize="token")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        packed_logits(model, mb).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_varlen_attention_is_chosen_on_cuda_in_bf16_and_refused_where_it_cannot_run():
    cuda = torch.device("cuda")
    has_varlen = hasattr(torch.nn.attention, "varlen") or importlib.util.find_spec("torch.nn.attention.varlen")
    flash = importlib.util.find_spec("flash_attn") is not None
    expected = "flash_attention_2" if flash else (DOCUMENT_VARLEN if has_varlen else DOCUMENT_SDPA)
    assert resolve_attn_implementation("auto", cuda, torch.bfloat16) == expected
    assert resolve_attn_implementation("auto", cuda, torch.float32) == DOCUMENT_SDPA  # the kernel is half only
    assert resolve_attn_implementation("auto", torch.device("cpu"), torch.bfloat16) == DOCUMENT_SDPA
    with pytest.raises(ValueError, match="document_varlen.*needs CUDA"):
        resolve_attn_implementation(DOCUMENT_VARLEN, torch.device("cpu"), torch.bfloat16)


def test_varlen_layout_gives_long_samples_their_own_call_and_runs_short_ones_together():
    n = SDPA_FROM_TOKENS
    layout = varlen_layout((5, 3, n, 7, n + 1, 2, 4))
    shapes = [
        (s.start, s.end, None if s.cu_seqlens is None else s.cu_seqlens.tolist(), s.longest) for s in layout.segments
    ]
    assert shapes == [
        (0, 8, [0, 5, 3 + 5], 5),
        (8, 8 + n, None, n),
        (8 + n, 15 + n, [0, 7], 7),
        (15 + n, 16 + 2 * n, None, n + 1),
        (16 + 2 * n, 22 + 2 * n, [0, 2, 6], 4),
    ]
    assert layout.segments[0].cu_seqlens.dtype == torch.int32


def test_a_varlen_row_of_long_samples_runs_per_sample_sdpa_with_shared_kv_heads():
    """Samples >= SDPA_FROM_TOKENS: `document_varlen` takes one sdpa call per sample with
    grouped-query heads shared (no varlen kernel, so this runs on CPU), and must give what
    `document_sdpa` gives with the kv heads repeated. fp32, values O(1), head dim 8: both are the
    same softmax(QK^T)V sums in a possibly different order, a few ulps apart (1e-5 >> 8 * 1.2e-7)."""
    lengths = (SDPA_FROM_TOKENS, SDPA_FROM_TOKENS + 3)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(4, sum(lengths), 8, generator=generator)
    k, v = (torch.randn(2, sum(lengths), 8, generator=generator) for _ in range(2))
    got = _varlen_attention(q, k, v, varlen_layout(lengths), None, groups=2)
    repeated = [x.repeat_interleave(2, 0) for x in (k, v)]
    want = _document_attention(q, *repeated, document_layout(lengths), 0.0, None)
    assert got.shape == want.shape == (1, sum(lengths), 4, 8)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_varlen_row_puts_a_shared_prefix_in_the_runs_and_its_suffixes_in_groups_after_it():
    layout = varlen_layout([Document(5), Document(20, (3, 7, 4)), Document(6)], sdpa_from=16)
    kinds = [
        (type(s).__name__, s.start, s.end, getattr(s, "prefix", None) or getattr(s, "cu_seqlens", None))
        for s in layout.segments
    ]
    assert [k[:3] for k in kinds] == [
        ("VarlenSegment", 0, 5),  # the lone sample's run closes before the prefix
        ("VarlenSegment", 5, 25),  # the prefix, 20 >= sdpa_from tokens: its own sdpa call
        ("DocumentGroup", 25, 39),  # its three suffixes, padded to 7 in one call
        ("VarlenSegment", 39, 45),
    ]
    group = layout.segments[2]
    assert isinstance(group, DocumentGroup) and group.prefix == slice(5, 25) and group.count == 3


@pytest.mark.parametrize("sdpa_from", [SDPA_FROM_TOKENS, 16])
def test_a_varlen_row_with_shared_prefixes_attends_and_differentiates_as_document_sdpa(
    monkeypatch: pytest.MonkeyPatch, sdpa_from: int
):
    """`document_varlen` with shared prefixes (the short runs through the varlen kernel's
    arithmetic, `reference_varlen_attn`: the kernel is CUDA only) against `document_sdpa`, which
    test_shared_prefix.py checks against rows without sharing. Prefixes below and (sdpa_from 16)
    above the per-sample sdpa threshold; 4 query heads on 2 kv heads. fp32, values O(1), head dim
    8: the same softmax(QK^T)V sums in another order, a few ulps apart (1e-5 >> 64 x 1.2e-7),
    gradients too (sums of as many such terms)."""
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: reference_varlen_attn)
    documents = [Document(5), Document(20, (3, 7, 4, 11)), Document(6), Document(18, (2, 9)), Document(4)]
    total = sum(d.length for d in documents)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(4, total, 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, total, 8, generator=generator, requires_grad=True) for _ in range(2))
    weights = torch.randn(1, total, 4, 8, generator=generator)
    results = []
    for run in (
        lambda: _varlen_attention(q, k, v, varlen_layout(documents, sdpa_from=sdpa_from), None, groups=2),
        lambda: _document_attention(
            q, *(x.repeat_interleave(2, 0) for x in (k, v)), document_layout(documents), 0.0, None
        ),
    ):
        out = run()
        grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
        results.append((out.detach(), *grads))
    for got, want in zip(*results, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
