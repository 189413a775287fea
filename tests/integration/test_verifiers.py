"""`verifiers:<id>` served by envrl's env server, running in the example's own venv (verifiers 0.4).

Each rollout runs verifiers' null harness as a subprocess (a chat program talking to envrl's chat
proxy), so a rollout costs seconds, not milliseconds: the tests keep to a few groups.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envrl.envs.chat_tokens import chat_renderer
from envrl.serve.client import EnvClient
from envrl.traces import Trace
from scripts.tiny_model import DEFAULT_DIR
from tests.integration.verifiers_env import NULL_HARNESS, verifiers_env_server

TOKENIZER = str(DEFAULT_DIR)
REPLIES = ["12 13 14", "twelve"]
SCRIPTED = {"type": "scripted", "replies": REPLIES, "tokenizer": TOKENIZER}
ACCESS = ("--model-access", json.dumps({"tokenizers": [TOKENIZER]}))
TIMEOUT = 180.0


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars)


def run_group(address: str, n: int, client: dict[str, Any], sampling: dict[str, Any], task_idx: int = 0) -> list[Trace]:
    async def main() -> list[Trace]:
        async with EnvClient(address, timeout=TIMEOUT) as env:
            return await env.run_group(task_idx, n, client=client, sampling=sampling, seed=5)

    return asyncio.run(main())


def test_verifiers_episodes_become_traces_with_every_model_call_as_a_token_turn(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 4}, "agent": NULL_HARNESS}
    with verifiers_env_server(tmp_path, args, *ACCESS) as server:
        traces = run_group(server.address, 2, SCRIPTED, {"max_tokens": 8})
    renderer = chat_renderer(TOKENIZER)
    assert sorted(t.turns[0].response["content"] for t in traces) == REPLIES
    for trace in traces:
        assert trace.error is None, trace.error
        (turn,) = trace.turns
        # The prompt is verifiers' own (its taskset's system prompt and count), sent by its harness.
        assert [m["role"] for m in turn.prompt] == ["system", "user"]
        assert turn.prompt[1]["content"] == trace.task.data["prompt"]  # type: ignore[attr-defined]
        # The turn's tokens are the ones the client rendered and produced, not re-tokenised text.
        assert turn.tokens is not None
        assert turn.tokens.prompt_ids == renderer.prompt_ids(turn.prompt, None, None)
        assert turn.tokens.completion_ids == [*renderer.encode(turn.response["content"]), renderer.eos_id]
        # The reward is verifiers' own reward function's.
        assert trace.reward == pytest.approx(digit_share(turn.response["content"]))
        assert trace.metrics["digit_share"] == trace.reward


def test_a_verifiers_env_raising_in_its_rollout_gives_error_traces_and_keeps_serving(tmp_path: Path) -> None:
    args = {"taskset": {"num_tasks": 2, "fail": True}, "agent": NULL_HARNESS}
    with verifiers_env_server(tmp_path, args, *ACCESS) as server:
        traces = run_group(server.address, 2, SCRIPTED, {"max_tokens": 8})
        again = run_group(server.address, 1, SCRIPTED, {"max_tokens": 8}, task_idx=1)
    for trace in [*traces, *again]:
        assert trace.reward is None and trace.stop_reason == "error"
        assert trace.error is not None and "built with fail=true" in trace.error.message, trace.error
        assert trace.num_turns == 1  # the model call before the failure is kept


def test_a_failing_model_call_gives_an_error_trace_that_names_it(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    client = {"type": "train", "base_url": dead, "model": TOKENIZER, "retry": {"max_retries": 0, "timeout": 5.0}}
    access = ("--model-access", json.dumps({"tokenizers": [TOKENIZER], "base_urls": [dead]}))
    args = {"taskset": {"num_tasks": 1}, "agent": {**NULL_HARNESS, "max_turns": 1}}
    with verifiers_env_server(tmp_path, args, *access) as server:
        (trace,) = run_group(server.address, 1, client, {"max_tokens": 8})
    assert trace.reward is None and trace.error is not None
    assert "chat proxy" in trace.error.message and "model call 0 failed" in trace.error.message, trace.error
