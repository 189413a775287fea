"""The chunked logprob head gives what full logits give: scores, entropy and both gradients."""

import pytest
import torch
from torch import nn

from envrl.trainer.loss import token_logprobs
from envrl.trainer.model.head import (
    LogprobHead,
    ScoreRequest,
    chunked_token_scores,
    compiled_kernels,
    install_logprob_head,
)
from envrl.trainer.packing import pack, packed_token_logprobs
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

# fp32 throughout. Each score is a log-softmax over V = 512 logits, each logit a D = 64 dot
# product: the chunked and the full path run the same kernels on different row slices, so
# they may differ only by summation order, a few ulps of the largest term (|logit| <= ~10,
# logsumexp <= ~16): 16 * 64 * 2**-24 ~ 6e-5 absolute at the very worst, 1e-5 in practice.
# The weight's gradient sums T = 300 rows chunk by chunk instead of in one GEMM: relative
# error ~ T * 2**-24 ~ 2e-5. Hence 1e-4 absolute / 1e-4 relative.
TOL = {"atol": 1e-4, "rtol": 1e-4}


def row(tokens: int = 301, vocab: int = 512, dim: int = 64, truncated: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, dim, generator=g)
    weight = (torch.randn(vocab, dim, generator=g) / dim**0.5).requires_grad_()
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    temperature = torch.rand(tokens, generator=g) + 0.5
    top_p = torch.where(torch.rand(tokens, generator=g) < 0.3, 0.8, 1.0) if truncated else torch.ones(tokens)
    top_k = torch.where(torch.rand(tokens, generator=g) < 0.3, 20, 0) if truncated else torch.zeros(tokens).long()
    return hidden.requires_grad_(), weight, ScoreRequest(ids, temperature, top_p, top_k)


def full_path(hidden, weight, request):
    return token_logprobs(hidden @ weight.t(), request.input_ids, request.temperature, request.top_p, request.top_k)


def grads(scores: torch.Tensor, upstream: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad((scores * upstream).sum(), inputs)


@pytest.mark.parametrize("chunk_elements", [512 * 37, 512 * 64, 2**26])  # 37 rows, 64 rows, one chunk (logits kept)
@pytest.mark.parametrize("truncated", [False, True])
def test_chunked_scores_and_gradients_match_full_logits(chunk_elements, truncated):
    hidden, weight, request = row(truncated=truncated)
    upstream = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    expected, expected_entropy = full_path(hidden, weight, request)
    got, got_entropy = chunked_token_scores(hidden, weight, request, chunk_elements)
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(got_entropy, expected_entropy, **TOL)
    assert not got_entropy.requires_grad
    for g, e in zip(grads(got, upstream, hidden, weight), grads(expected, upstream, hidden, weight), strict=True):
        torch.testing.assert_close(g, e, **TOL)


def test_compiled_kernels_score_and_differentiate_like_full_logits():
    """The compiled kernels (what `trainer.compile` turns on) reorder the fp32 reductions only,
    so the same tolerance holds; chunks of 37 rows leave a shorter last chunk (a second shape)."""
    hidden, weight, request = row(truncated=False)
    upstream = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    expected, expected_entropy = full_path(hidden, weight, request)
    got, got_entropy = chunked_token_scores(hidden, weight, request, 512 * 37, compiled_kernels())
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(got_entropy, expected_entropy, **TOL)
    for g, e in zip(grads(got, upstream, hidden, weight), grads(expected, upstream, hidden, weight), strict=True):
        torch.testing.assert_close(g, e, **TOL)


def test_the_tiny_model_scores_a_packed_row_alike_through_the_head_and_through_logits():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32, attn_implementation="sdpa")
    samples = synthetic_samples(5, prompt_len=(4, 9), completion_len=(10, 30), vocab_size=model.config.vocab_size)
    (mb,) = pack(samples, 4096, "token")
    full, full_entropy = packed_token_logprobs(model, mb)
    full_grads = torch.autograd.grad(full.sum(), [model.lm_head.weight, model.model.layers[-1].mlp.down_proj.weight])
    assert install_logprob_head(model) and isinstance(model.lm_head, LogprobHead)
    assert model.lm_head.weight is model.model.embed_tokens.weight or not model.config.tie_word_embeddings
    chunked, chunked_entropy = packed_token_logprobs(model, mb)
    chunked_grads = torch.autograd.grad(
        chunked.sum(), [model.lm_head.weight, model.model.layers[-1].mlp.down_proj.weight]
    )
    torch.testing.assert_close(chunked, full, **TOL)
    torch.testing.assert_close(chunked_entropy, full_entropy, **TOL)
    for g, e in zip(chunked_grads, full_grads, strict=True):
        torch.testing.assert_close(g, e, **TOL)
    # outside a scoring request the head is the linear layer it was: logits for any other caller
    hidden = torch.randn(1, 3, model.config.hidden_size)
    torch.testing.assert_close(model.lm_head(hidden), nn.functional.linear(hidden, model.lm_head.weight))


def test_a_lora_wrapped_or_biased_head_keeps_the_logits_path():
    biased = nn.Module()
    biased.head = nn.Linear(4, 8, bias=True)
    biased.get_output_embeddings = lambda: biased.head
    assert not install_logprob_head(biased)
    assert type(biased.head) is nn.Linear
