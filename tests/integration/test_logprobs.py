"""Both sides of the importance ratio are the distribution that sampled, at any temperature.

The trainer's own code (packing, packed forward, per-token temperature and top-k/top-p
truncation, the loss's mismatch KL) scores completions sampled by the session's vLLM server
(`vllm_server` in tests/conftest.py) with the weights vLLM serves: the step-0 mismatch KL must
be ~0. Raw-logit logprobs against temperature-scaled trainer logprobs gave 2.75e-3 at T = 0.7.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from envrl.data.samples import TrainingSample
from envrl.model.inference import TokenCompletion
from envrl.trainer.config import LossConfig
from envrl.trainer.loss import policy_loss, token_logprobs
from envrl.trainer.packing import pack, packed_logits
from tests.support.logprobs import PROMPTS, sample_completions
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

MAX_KL = 1e-3
"""The bound of the issue; measured: 0 (logprob differences ~1e-7, whose k3 KL rounds to 0 in float32)."""


def trainer_mismatch_kl(completions: list[TokenCompletion], temperature: float, top_p: float, top_k: int) -> float:
    """Mean k3 KL over the completion tokens, computed by the trainer's code path at policy 0."""
    samples = [
        TrainingSample(
            input_ids=prompt + c.completion_ids,
            loss_mask=[0] * len(prompt) + [1] * len(c.completion_ids),
            inference_logprobs=[0.0] * len(prompt) + c.logprobs,
            advantage=1.0,
            env="e",
            task_idx=i,
            policy_step=0,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        )  # fmt: skip
        for i, (prompt, c) in enumerate(zip(PROMPTS, completions, strict=True))
    ]
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32).eval()
    kl = tokens = 0.0
    with torch.no_grad():
        for mb in pack(samples, max_tokens=4096, normalize="token"):
            logprobs, _ = token_logprobs(packed_logits(model, mb), mb.input_ids[0], mb.temperature, mb.top_p, mb.top_k)
            _, stats = policy_loss(
                logprobs, mb.inference_logprobs, mb.advantages, mb.loss_mask, mb.weights, LossConfig()
            )
            kl += stats["mismatch_kl"].item()
            tokens += stats["loss_tokens"].item()
    return kl / tokens


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(0.6, 1.0, 0), (1.0, 1.0, 0), (1.3, 1.0, 0), (1.0, 0.8, 0), (0.7, 0.9, 40)],
)
def test_step_zero_mismatch_kl_is_zero_at_any_temperature_and_truncation(
    vllm_server: Any, temperature: float, top_p: float, top_k: int
) -> None:
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    completions = sample_completions(vllm_server.base_url, vllm_server.model, sampling)
    assert sum(len(c.completion_ids) for c in completions) > 20
    kl = trainer_mismatch_kl(completions, temperature, top_p, top_k)
    untruncated = trainer_mismatch_kl(completions, 1.0, 1.0, 0)
    print(f"step-0 mismatch KL at temperature {temperature}, top_p {top_p}, top_k {top_k}: {kl:.2e} "
          f"(scored at temperature 1 without truncation: {untruncated:.2e})")  # fmt: skip
    assert kl < MAX_KL
    if (temperature, top_p, top_k) != (1.0, 1.0, 0):
        # The check sees a wrong distribution on either side: 8e-4 at T = 1.3 (the random model is
        # near uniform, so temperature moves it little) to 16 with top-k, against ~1e-12 of float noise.
        assert untruncated > 1e-4
