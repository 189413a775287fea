"""When `/health` first answers 200, the engine has run `warmup_requests` seeded requests of the rollouts' kind,
leaving nothing behind but its counters; a failed warm-up fails the server's start-up with the engine's error."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from loguru import logger

WARMUP_ENV = "ENVRL_INFERENCE_WARMUP_REQUESTS"
"""Carries `InferenceConfig.warmup_requests` from the entry point to the endpoint plugin that runs it."""
PROMPT_TOKENS = 16
MAX_TOKENS = 8


async def warm_up(engine: Any, requests: int) -> None:
    """Run `requests` concurrent generations on `engine` (vLLM's AsyncLLM) and wait for all."""
    if requests <= 0:
        return
    from vllm import SamplingParams

    vocab = engine.model_config.get_vocab_size()
    started = time.perf_counter()

    async def one(i: int) -> None:
        prompt = {"prompt_token_ids": [(i * PROMPT_TOKENS + t) % vocab for t in range(PROMPT_TOKENS)]}
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i, logprobs=0, ignore_eos=True)
        async for _ in engine.generate(prompt, params, request_id=f"envrl-warmup-{i}"):
            pass

    await asyncio.gather(*(one(i) for i in range(requests)))
    await engine.reset_prefix_cache()
    logger.info(
        f"warm-up: {requests} concurrent generations of {MAX_TOKENS} tokens took {time.perf_counter() - started:.2f} s"
    )
