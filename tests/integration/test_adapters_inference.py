"""Both adapters against real vLLM (heavy: run under /tmp/envrl-heavy.lock): exact-token Traces.
(`rl` learning on both: test_adapters_rl.py.)

The OpenEnv env is served from its own light venv (deps/envs/openenv-count, `project = ...`),
with the OpenEnv server (openenv-core) as that env server's child.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from envrl.data.traces import Trace
from envrl.envclient.client import EnvClient
from envrl.envs import SamplingArgs, TrainClientConfig, build_client, load_environment
from envrl.runtime.http import RetryPolicy
from tests.support.env_servers import running_env_server

ROOT = Path(__file__).parents[2]
OPENENV_PROJECT = ROOT / "deps" / "envs" / "openenv-count"
OPENENV_PYTHON = OPENENV_PROJECT / ".venv" / "bin" / "python"
RETRY = RetryPolicy(max_retries=1, timeout_s=120.0)
SAMPLING = SamplingArgs(max_tokens=8, temperature=1.0, seed=3)

pytestmark = pytest.mark.skipif(
    not OPENENV_PYTHON.exists(), reason=f"the example's venv is missing: uv sync --project {OPENENV_PROJECT} --locked"
)


def assert_exact_tokens(trace: Trace, model_dir: str) -> None:
    """Every turn's logprobs are the model's own for its recorded tokens: the tokens are what vLLM sampled from."""
    assert trace.error is None, trace.error
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for turn in trace.turns:
        tokens = turn.tokens
        assert tokens is not None and len(tokens.completion_ids) == len(tokens.completion_logprobs) > 0
        ids = torch.tensor([tokens.prompt_ids + tokens.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(tokens.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens.completion_ids)[:, None])[:, 0]
        # float32 recomputation vs vLLM-CPU's float32 kernels: agreement to ~1e-5 (as test_envs_inference.py)
        assert max(abs(a - b) for a, b in zip(expected.tolist(), tokens.completion_logprobs, strict=True)) < 1e-4


def test_trl_rollouts_give_exact_token_traces(vllm_server: Any) -> None:
    env = load_environment("trl-count", num_train=4)
    config = TrainClientConfig(base_url=vllm_server.base_url, model=vllm_server.model, retry=RETRY)

    async def main() -> list[Trace]:
        client = build_client(config)
        try:
            return await env.run_group(env.get_task("train", 1), client, SAMPLING, 2, scoring_timeout=30.0)
        finally:
            await client.aclose()

    for trace in asyncio.run(main()):
        assert_exact_tokens(trace, vllm_server.model)
        assert trace.turns[0].tools is not None and "digit_share" in trace.metrics


def test_openenv_rollouts_from_the_examples_venv_give_exact_token_traces(vllm_server: Any, tmp_path: Path) -> None:
    client = {"type": "train", "base_url": vllm_server.base_url, "model": vllm_server.model}
    with running_env_server(
        tmp_path, "--env.args", '{"turns": 2}', "--pool", '{"min_workers": 1, "max_workers": 1}',
        env_id="openenv-count", client=client, python=str(OPENENV_PYTHON), ready_timeout=300,
    ) as server:  # fmt: skip

        async def main() -> Trace:
            async with EnvClient(server.address) as env_client:
                (trace,) = await env_client.run(0, sampling=SAMPLING, seed=3)
                return trace

        trace = asyncio.run(main())
    assert_exact_tokens(trace, vllm_server.model)
    assert trace.num_turns == 2 and len(trace.branches) == 1  # the second turn extends the first token by token
    assert trace.reward is not None and 0.0 <= trace.reward <= 2.0
