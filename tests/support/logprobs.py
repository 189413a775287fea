"""Completions sampled from the session's vLLM server for logprob comparisons, one helper for
every test that checks the importance ratio's two sides (test_logprobs, test_lora), and the
check that a sample trains exactly its rollout's generated tokens (test_multi_turn,
test_tool_families).

Guarantee: `sample_completions` draws one completion per prompt in `PROMPTS`, each with its own
fixed seed, so two calls against the same weights return the same tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from envrl.data.samples import TrainingSample
from envrl.data.traces import Trace
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


def trained_and_generated(
    sample: TrainingSample, trace: Trace
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(token, logprob) of every token `sample` trains on, and of every token the rollout's turns
    generated, in order: equal when the sample trains exactly the generated tokens."""
    trained = [
        (t, lp) for t, m, lp in zip(sample.input_ids, sample.loss_mask, sample.inference_logprobs, strict=True) if m
    ]
    generated = [
        (t, lp)
        for turn in trace.turns
        for t, lp in zip(turn.tokens.completion_ids, turn.tokens.completion_logprobs, strict=True)
    ]
    return trained, generated
