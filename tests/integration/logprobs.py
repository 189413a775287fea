"""Completions sampled from the session's vLLM server for logprob comparisons, one helper for
every test that checks the importance ratio's two sides (test_logprobs, test_lora).

Guarantee: `sample_completions` draws one completion per prompt in `PROMPTS`, each with its own
fixed seed, so two calls against the same weights return the same tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.runtime.http import RetryPolicy

PROMPTS = [[1, 17, 42, 99, 7], [1, 300, 301, 302, 303, 304, 305, 5], [1, 900], [1, 64, 65]]


def sample_completions(base_url: str, model: str, sampling: dict[str, Any]) -> list[TokenCompletion]:
    async def main() -> list[TokenCompletion]:
        client = InferenceClient(base_url, model, RetryPolicy(max_retries=0, timeout_s=120.0))
        try:
            calls = [client.generate(p, {**sampling, "max_tokens": 32, "seed": 100 + i}) for i, p in enumerate(PROMPTS)]
            return list(await asyncio.gather(*calls))
        finally:
            await client.aclose()

    return asyncio.run(main())
