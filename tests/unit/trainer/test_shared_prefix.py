"""Shared prefixes: a group's common prompt is computed once and every sample trains exactly as alone."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import envrl.trainer.model.attention as attention
from envrl.data.samples import TrainingSample
from envrl.trainer.config import LossConfig
from envrl.trainer.loss import policy_loss, token_logprobs
from envrl.trainer.model.attention import DOCUMENT_SDPA, DOCUMENT_VARLEN
from envrl.trainer.model.layout import Document, document_layout
from envrl.trainer.packing import (
    MIN_SHARED_PREFIX,
    MicroBatch,
    pack,
    packed_logits,
    shared_prefix_groups,
    shares_prefixes,
)
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.varlen_reference import reference_varlen_attn

P = MIN_SHARED_PREFIX


def sample(tokens: list[int], trained_from: int, advantage: float = 1.0) -> TrainingSample:
    return TrainingSample(
        input_ids=tokens,
        loss_mask=[0] * trained_from + [1] * (len(tokens) - trained_from),
        inference_logprobs=[0.0] * trained_from + [-1.0] * (len(tokens) - trained_from),
        advantage=advantage,
        env="e",
        task_idx=0,
        policy_step=0,
    )


def test_a_groups_prompt_is_held_once_and_its_samples_continue_its_positions():
    prompt = list(range(10, 10 + P + 2))
    a, b = sample(prompt + [1, 2, 3], P + 2), sample(prompt + [4, 5], P + 2)
    (mb,) = pack([a, b], max_tokens=1000, normalize="token", share_prefixes=True)
    # the prefix stops one token short of the prompt: each sample's rest starts untrained
    assert mb.documents == (Document(P + 1, (4, 3)),)
    assert mb.input_ids[0].tolist() == prompt[:-1] + [prompt[-1], 1, 2, 3] + [prompt[-1], 4, 5]
    assert mb.position_ids[0].tolist() == list(range(P + 1)) + list(range(P + 1, P + 5)) + list(range(P + 1, P + 4))
    assert mb.loss_mask.tolist() == [False] * (P + 2) + [True] * 3 + [False, True, True]
    assert (mb.num_samples, mb.sample_tokens, mb.num_tokens) == (2, 2 * P + 9, P + 8)
    assert mb.lengths == (P + 5, 3)  # the prefix counts in its first sample's segment


def test_the_prefix_stops_before_any_samples_first_trained_token():
    """Completions that begin alike (a tool call's opening tokens) are trained per sample: the
    prefix never reaches into what any member trains on."""
    prompt = list(range(10, 10 + P + 4))
    same_start = [sample(prompt + [7, 7, 8], P + 4), sample(prompt + [7, 7, 9], P + 4)]
    (mb,) = pack(same_start, max_tokens=1000, normalize="token", share_prefixes=True)
    assert mb.documents == (Document(P + 3, (4, 4)),)
    trained = pack(same_start, max_tokens=1000, normalize="token")[0].loss_mask.sum()
    assert mb.loss_mask.sum() == trained == 6


def test_short_common_prefixes_and_unrelated_samples_stay_alone():
    short = [sample(list(range(10, 10 + P - 1)) + [i, 3], P - 1) for i in (1, 2)]
    other = sample(list(range(500, 540)), 20)
    groups = shared_prefix_groups([*short, other], max_tokens=1000)
    assert sorted(members for _, members in groups) == [[0], [1], [2]]
    assert all(prefix == 0 for prefix, _ in groups)


def test_a_group_is_cut_where_its_row_would_pass_the_budget():
    prompt = list(range(10, 10 + 2 * P))
    members = [sample(prompt + [i] * 20, 2 * P) for i in range(1, 5)]
    groups = shared_prefix_groups(members, max_tokens=2 * P + 3 * 21)  # the prefix and three rests
    assert [len(m) for _, m in groups] == [3, 1]
    mbs = pack(members, max_tokens=2 * P + 3 * 21, normalize="token", share_prefixes=True)
    assert all(mb.num_tokens <= 2 * P + 3 * 21 for mb in mbs)
    assert sum(mb.num_samples for mb in mbs) == 4


def grouped_samples() -> list[TrainingSample]:
    """Four groups of four sharing a prompt, completions of mixed lengths (so a group's suffixes
    run as several padded calls), and two samples alone."""
    groups = synthetic_samples(16, prompt_len=(P + 2, 3 * P), completion_len=(2, 60), group_size=4, seed=5)
    return groups + synthetic_samples(2, prompt_len=(4, 8), seed=6)


def per_sample(mb: MicroBatch, values: torch.Tensor) -> dict[tuple[int, ...], list[float]]:
    """Each sample of the row (keyed by its tokens) -> `values` at its trained positions."""
    ids, mask, out, start = mb.input_ids[0].tolist(), mb.loss_mask.tolist(), {}, 0
    for d in mb.documents:
        head = slice(start, start + d.prefix)
        start = head.stop
        for length in d.suffixes or (0,):
            tail = slice(start, start + length)
            start = tail.stop
            tokens = ids[head] + ids[tail]
            kept = mask[head] + mask[tail]
            picked = values[head].tolist() + values[tail].tolist()
            out[tuple(tokens)] = [v for v, m in zip(picked, kept, strict=True) if m]
    return out


@pytest.mark.parametrize("attn", [DOCUMENT_SDPA, DOCUMENT_VARLEN])
def test_shared_prefix_rows_score_and_train_every_sample_as_rows_without_sharing(
    attn: str, monkeypatch: pytest.MonkeyPatch
):
    """Same logprobs per trained token and same gradients of the loss, shared or not. fp32 with
    logits O(1): the two rows sum the same attention terms in a different order and grouping,
    a few ulps per sum (1e-5 >> 64 terms x 1.2e-7); grads summed over 18 samples agree to 1e-5
    of the largest. `document_varlen` runs its short samples through the CUDA kernel's
    arithmetic (`reference_varlen_attn`), the rest through its own calls."""
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: reference_varlen_attn)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32, attn_implementation=attn)
    samples = grouped_samples()
    results = []
    for share in (False, True):
        (mb,) = pack(samples, max_tokens=1 << 16, normalize="token", share_prefixes=share)
        model.zero_grad()
        logprobs, _ = token_logprobs(packed_logits(model, mb), mb.input_ids[0], mb.temperature)
        loss, _ = policy_loss(logprobs, mb.inference_logprobs, mb.advantages, mb.loss_mask, mb.weights, LossConfig())
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((mb, per_sample(mb, logprobs.detach()), loss.item(), grads))
    (plain, plain_lp, plain_loss, plain_grads), (shared, shared_lp, shared_loss, shared_grads) = results
    assert sum(len(d.suffixes) for d in shared.documents) == 16 and shared.num_tokens < plain.num_tokens
    assert max(len(document_layout([d]).groups) for d in shared.documents) >= 3  # prefix + several suffix runs
    assert plain_lp.keys() == shared_lp.keys() and len(plain_lp) == 18
    for tokens, values in plain_lp.items():
        assert shared_lp[tokens] == pytest.approx(values, abs=1e-5)
    assert shared_loss == pytest.approx(plain_loss, abs=1e-5)
    for name, grad in plain_grads.items():
        scale = grad.abs().max().item()
        assert torch.allclose(shared_grads[name], grad, atol=1e-5 * scale, rtol=0), name


def test_sequence_level_ratios_average_each_sample_over_its_own_tokens():
    """GSPO's per-sample mean reads `lengths`: with the prefix counted in its first sample's
    segment (where nothing is trained) the means are those of the unshared row."""
    samples = grouped_samples()[:8]
    config = LossConfig(ratio_level="sequence")
    losses = []
    for share in (False, True):
        (mb,) = pack(samples, max_tokens=1 << 16, normalize="sequence", share_prefixes=share)
        # float64, so the rows' different summation orders round far below the tolerance
        inference, advantages, weights = (t.double() for t in (mb.inference_logprobs, mb.advantages, mb.weights))
        # a made-up policy: logprob = inference logprob + a per-token shift that differs by sample
        logprobs = inference + 0.1 * torch.sin(mb.input_ids[0].double())
        loss, _ = policy_loss(logprobs, inference, advantages, mb.loss_mask, weights, config, lengths=mb.lengths)
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)


def test_a_batch_with_nothing_to_share_packs_as_without_sharing():
    samples = synthetic_samples(12, prompt_len=(4, 8), completion_len=(8, 24))
    plain, shared = (pack(samples, 64, "token", share_prefixes=share) for share in (False, True))
    assert [mb.documents for mb in shared] == [mb.documents for mb in plain]
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(plain, shared, strict=True))


@pytest.mark.parametrize(
    ("attn", "choice", "shared"),
    [
        (DOCUMENT_SDPA, "auto", True),  # measured to pay (docs/trainer.md)
        (DOCUMENT_VARLEN, "auto", False),  # not measured on a GPU yet
        (DOCUMENT_VARLEN, True, True),
        (DOCUMENT_SDPA, False, False),
        ("sdpa", True, False),  # transformers' own attentions cannot run a shared prefix
        ("flash_attention_2", True, False),
    ],
)
def test_prefixes_are_shared_where_the_attention_runs_them_by_default_only_where_measured(
    attn: str, choice: str | bool, shared: bool
):
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation=attn))
    assert shares_prefixes(model, choice) is shared  # type: ignore[arg-type]
