"""Model clients: configs cross the wire; train/eval clients speak HTTP to a local test server."""

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import TypeAdapter

from envrl.data.traces import Message, Task, Trace
from envrl.envs import (
    ClientConfig,
    Environment,
    EvalClientConfig,
    SamplingArgs,
    ScriptedClient,
    ScriptedClientConfig,
    TrainClientConfig,
    build_client,
)
from envrl.model.chat_tokens import chat_renderer
from envrl.model.client import EvalClient, TrainClient
from envrl.runtime.http import HttpCallError, RetryPolicy
from tests.support.tiny_chat import TINY_CHAT

Handler = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
FAST_RETRY = RetryPolicy(max_retries=2, backoff_s=0.01, timeout_s=10.0)


class Recorder:
    """A loopback HTTP server answering each POST with `handle(path, body)`; keeps the bodies.

    `GET /v1/models` says it serves TINY_CHAT with a context of `max_model_len` tokens.
    """

    def __init__(self, handle: Handler) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.max_model_len = 2048
        recorder = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
                self._answer(200, {"data": [{"id": TINY_CHAT, "max_model_len": recorder.max_model_len}]})

            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.requests.append((self.path, body))
                self._answer(*handle(self.path, body))

            def _answer(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], Recorder]]:
    servers: list[Recorder] = []

    def start(handle: Handler) -> Recorder:
        servers.append(Recorder(handle))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


class PromptTask(Task):
    prompt: str


class TwoTurns(Environment):
    async def env_response(self, state: Any) -> list[Message]:
        if state.trace.num_turns == 1:
            return [{"role": "user", "content": "Higher."}]
        state.stop()
        return []


def generated(token_ids: list[int], logprobs: list[float], finish_reason: str = "stop") -> dict[str, Any]:
    """vLLM's `/inference/v1/generate` answer (tokens mode) for one completion."""
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(token_ids, logprobs, strict=False)]
    return {
        "choices": [
            {"index": 0, "token_ids": token_ids, "logprobs": {"content": content}, "finish_reason": finish_reason}
        ]
    }


def test_client_configs_round_trip_as_a_tagged_union() -> None:
    adapter = TypeAdapter(ClientConfig)
    for config in (
        TrainClientConfig(base_url="http://127.0.0.1:8000", model="m"),
        EvalClientConfig(base_url="http://127.0.0.1:8000/v1", model="m", return_tokens=True),
        ScriptedClientConfig(replies=["a", "b"], delay_s=0.5),
    ):
        assert adapter.validate_json(adapter.dump_json(config)) == config
    assert isinstance(adapter.validate_python({"type": "scripted"}), ScriptedClientConfig)
    with pytest.raises(ValueError, match="does not match any of the expected tags"):
        adapter.validate_python({"type": "telepathy"})


def test_sampling_args_become_request_fields_with_extras_passed_through() -> None:
    args = SamplingArgs(max_tokens=8, temperature=0.7, seed=3, top_k=5, extra={"min_p": 0.1})
    assert args.to_request() == {"max_tokens": 8, "temperature": 0.7, "top_p": 1.0, "top_k": 5, "seed": 3, "min_p": 0.1}
    assert "top_k" not in SamplingArgs(max_tokens=8).to_request(), "0 (all tokens) is left to the server's default"


def test_sampling_args_refuse_a_negative_temperature_and_extras_that_shadow_their_keys() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        SamplingArgs(max_tokens=8, temperature=-0.5)
    with pytest.raises(ValueError, match=r"sampling.extra sets \['top_k'\]"):
        SamplingArgs(max_tokens=8, extra={"top_k": 5})


def test_build_client_makes_the_configured_kind() -> None:
    assert isinstance(build_client(ScriptedClientConfig()), ScriptedClient)
    assert isinstance(build_client(TrainClientConfig(base_url="http://x", model=TINY_CHAT)), TrainClient)
    assert isinstance(build_client(EvalClientConfig(base_url="http://x/v1", model="m")), EvalClient)


def train_rollout(env: Environment, server: Recorder, sampling: SamplingArgs) -> Trace:
    """Train task 0 of `env` rolled out by a train client against the fake server."""

    async def main() -> Trace:
        client = build_client(TrainClientConfig(base_url=server.url, model=TINY_CHAT, retry=FAST_RETRY))
        try:
            return await env.run_rollout(env.get_task("train", 0), client, sampling)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_train_client_sends_token_prompts_that_extend_across_turns(serve: Callable[[Handler], Recorder]) -> None:
    renderer = chat_renderer(TINY_CHAT)
    reply = renderer.encode("42") + [renderer.eos_id]

    def completions(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, generated(reply, [-0.5] * len(reply))

    server = serve(completions)
    env = TwoTurns(tasks=[PromptTask(idx=0, prompt="Guess.")], max_turns=3)

    trace = train_rollout(env, server, SamplingArgs(max_tokens=4, seed=1))
    assert trace.error is None and trace.num_turns == 2 and len(trace.branches) == 1
    (path1, first), (path2, second) = server.requests
    assert path1 == path2 == "/inference/v1/generate"
    assert first["token_ids"] == renderer.render([{"role": "user", "content": "Guess."}], None, generation_prompt=True)
    assert second["token_ids"][: len(first["token_ids"]) + len(reply)] == first["token_ids"] + reply
    params = first["sampling_params"]
    assert (params["max_tokens"], params["seed"], params["detokenize"], first["model"]) == (4, 1, False, TINY_CHAT)
    turn = trace.turns[1]
    assert turn.tokens.prompt_ids == second["token_ids"] and turn.tokens.completion_logprobs == [-0.5] * len(reply)
    assert turn.response == {"role": "assistant", "content": "42"}


def test_a_prompt_that_outgrows_the_context_ends_the_rollout_as_truncated(serve: Callable[[Handler], Recorder]) -> None:
    renderer = chat_renderer(TINY_CHAT)
    reply = renderer.encode("42") + [renderer.eos_id]

    def completions(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, generated(reply, [-0.5] * len(reply))

    server = serve(completions)
    env = TwoTurns(tasks=[PromptTask(idx=0, prompt="Guess.")], max_turns=3)
    first_prompt = renderer.render([{"role": "user", "content": "Guess."}], None, generation_prompt=True)
    server.max_model_len = len(first_prompt) + len(reply) + 2  # room for turn 1, not for turn 2's prompt

    trace = train_rollout(env, server, SamplingArgs(max_tokens=4))
    assert trace.error is None and trace.num_turns == 1 and len(server.requests) == 1
    assert (trace.stop_reason, trace.is_truncated) == ("context_length", True)


def test_train_client_rejects_logprobs_that_do_not_match_the_tokens(serve: Callable[[Handler], Recorder]) -> None:
    server = serve(lambda path, body: (200, generated([5, 6], [-1.0])))
    env = Environment(tasks=[PromptTask(idx=0, prompt="Hi")])

    trace = train_rollout(env, server, SamplingArgs(max_tokens=4))
    assert trace.has_error and "logprob" in trace.error.message


def test_eval_client_speaks_openai_chat_and_retries_server_errors(serve: Callable[[Handler], Recorder]) -> None:
    answer = {"choices": [{"message": {"role": "assistant", "content": "olleh"}, "finish_reason": "stop"}]}
    answers = iter([(503, {"error": "warming up"}), (200, answer)])
    server = serve(lambda path, body: next(answers))
    env = Environment(tasks=[PromptTask(idx=0, prompt="reverse hello")], system_prompt="Be exact.")

    async def main() -> Any:
        config = EvalClientConfig(base_url=f"{server.url}/v1", model="judge", retry=FAST_RETRY, extra_body={"top_k": 2})
        client = build_client(config)
        try:
            return await env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=4, temperature=0.5))
        finally:
            await client.aclose()

    trace = asyncio.run(main())
    assert trace.error is None and trace.turns[0].response == {"role": "assistant", "content": "olleh"}
    assert trace.turns[0].tokens is None
    assert len(server.requests) == 2
    path, body = server.requests[-1]
    assert path == "/v1/chat/completions"
    assert body["messages"] == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "reverse hello"},
    ]
    assert (body["model"], body["max_tokens"], body["temperature"], body["top_k"]) == ("judge", 4, 0.5, 2)


def test_eval_client_returns_tokens_when_asked_and_the_server_gives_them(serve: Callable[[Handler], Recorder]) -> None:
    logprobs = {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}
    choice = {"message": {"content": "x"}, "token_ids": [7, 2], "finish_reason": "stop", "logprobs": logprobs}
    body = {"prompt_token_ids": [1, 2], "choices": [choice]}
    server = serve(lambda path, request: (200, body))
    env = Environment(tasks=[PromptTask(idx=0, prompt="p")])

    async def main() -> Any:
        client = build_client(
            EvalClientConfig(base_url=f"{server.url}/v1", model="m", return_tokens=True, retry=FAST_RETRY)
        )
        try:
            return await env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=4))
        finally:
            await client.aclose()

    tokens = asyncio.run(main()).turns[0].tokens
    assert (tokens.prompt_ids, tokens.completion_ids, tokens.completion_logprobs) == ([1, 2], [7, 2], [-0.1, -0.2])
    assert server.requests[0][1]["return_token_ids"] is True


def test_eval_client_names_a_missing_api_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVRL_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="ENVRL_TEST_KEY"):
        build_client(EvalClientConfig(base_url="http://x/v1", model="m", api_key_env="ENVRL_TEST_KEY"))


def test_an_api_key_read_with_its_newline_is_sent_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVRL_TEST_KEY", "sk-secret-123\n")
    client = build_client(EvalClientConfig(base_url="http://x/v1", model="m", api_key_env="ENVRL_TEST_KEY"))
    assert client.http.headers["Authorization"] == "Bearer sk-secret-123"  # type: ignore[attr-defined]
    asyncio.run(client.aclose())


def test_a_malformed_api_key_is_refused_without_quoting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the HTTP library's "illegal header value" error quoted the key into the Trace."""
    monkeypatch.setenv("ENVRL_TEST_KEY", "sk-secret\n123")
    with pytest.raises(ValueError, match="ENVRL_TEST_KEY.* control character at position 9") as raised:
        build_client(EvalClientConfig(base_url="http://x/v1", model="m", api_key_env="ENVRL_TEST_KEY"))
    assert "sk-secret" not in str(raised.value)


def test_the_train_client_returns_tool_calls_structured_and_the_generated_tokens_unchanged(
    serve: Callable[[Handler], Recorder],
) -> None:
    renderer = chat_renderer(TINY_CHAT)
    text = '<tool_call>{"name": "get", "arguments": {"key": "a"}}</tool_call>'
    ids = [*renderer.encode(text), renderer.eos_id]
    server = serve(lambda path, body: (200, generated(ids, [-0.5] * len(ids))))
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]

    async def main() -> Any:
        client = build_client(TrainClientConfig(base_url=server.url, model=TINY_CHAT, retry=FAST_RETRY))
        try:
            return await client.generate([{"role": "user", "content": "a?"}], SamplingArgs(max_tokens=64), tools=tools)
        finally:
            await client.aclose()

    response = asyncio.run(main())
    [call] = response.message["tool_calls"]
    assert call["function"] == {"name": "get", "arguments": '{"key": "a"}'}
    assert response.message["content"] is None and response.finish_reason == "tool_calls"
    assert response.tokens.completion_ids == ids and response.tokens.completion_logprobs == [-0.5] * len(ids)


def test_tools_for_a_model_whose_template_teaches_no_call_syntax_are_an_error_naming_it(tmp_path: Any) -> None:
    import shutil

    plain = tmp_path / "plain-chat"
    shutil.copytree(TINY_CHAT, plain)
    (plain / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")
    renderer = chat_renderer(str(plain))
    assert renderer.assistant_message(renderer.encode("hi"), tools=None) == {"role": "assistant", "content": "hi"}
    with pytest.raises(ValueError, match="teaches no tool-call syntax envrl parses"):
        renderer.assistant_message(renderer.encode("hi"), tools=[{"type": "function", "function": {"name": "f"}}])


def test_a_server_without_a_tool_call_parser_is_named_with_the_fix(serve: Callable[[Handler], Recorder]) -> None:
    """vLLM started without --enable-auto-tool-choice refuses every chat request with tools (issue 39)."""
    refusal = {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'}}
    server = serve(lambda path, body: (400, refusal))
    tool = {"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}

    async def main() -> None:
        client = build_client(EvalClientConfig(base_url=f"{server.url}/v1", model="m", retry=FAST_RETRY))
        try:
            await client.generate([{"role": "user", "content": "Go left."}], SamplingArgs(), tools=[tool])
        finally:
            await client.aclose()

    with pytest.raises(HttpCallError, match="start it with envrl's `inference`") as raised:
        asyncio.run(main())
    assert raised.value.status == 400 and f"the server at {server.url}/v1 does not serve tool calls" in str(
        raised.value
    )
