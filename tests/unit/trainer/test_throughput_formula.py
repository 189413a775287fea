"""The throughput bench's FLOP count: the one other trainers' MFU is stated in."""

import pytest

from envrl.model.tiny import build_tokenizer, qwen3_config
from scripts.bench.trainer_throughput import PEAK_BF16_TFLOPS, PRIME_RL_TOKENS_PER_S, matmul_params, model_flops
from tests.support.samples import synthetic_samples


def test_flop_count_turns_prime_rls_published_throughput_into_its_published_mfu(tmp_path):
    """prime-rl: Qwen3-0.6B, 16384-token rows, one H100: 11.9k tok/s and 11.1% MFU (rounded to
    0.1%, so the count must land within 0.05% of MFU, 0.5% of the FLOPs)."""
    qwen3_config("qwen3-0.6b", build_tokenizer()).save_pretrained(tmp_path)
    n, layers, width = matmul_params(tmp_path)
    assert (n, layers, width) == (596_049_920, 28, 16 * 128)  # a tied lm_head is one matmul, counted once
    (sample,) = synthetic_samples(1, prompt_len=(256, 256), completion_len=(16128, 16128))
    per_token = model_flops([sample], n, layers, width) / 16384
    assert per_token == pytest.approx(6 * n + 6 * layers * width * 16385)
    assert PRIME_RL_TOKENS_PER_S * per_token / (PEAK_BF16_TFLOPS["H100"] * 1e12) == pytest.approx(0.111, abs=5e-4)
