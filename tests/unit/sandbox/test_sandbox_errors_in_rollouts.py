"""A sandbox failure anywhere in a rollout (setup, a tool, an async reward function) is an error
Trace of its `sandbox_*` type with reward None, never a reward."""

from __future__ import annotations

import asyncio

import pytest

from envrl.data.traces import Task, Trace
from envrl.envs import Environment, Rubric, SamplingArgs, ScriptedClient, ScriptedClientConfig, ToolEnvironment
from envrl.sandbox import SandboxDied, SandboxOOM, SandboxStartError


class PromptTask(Task):
    prompt: str


TASKS = [PromptTask(idx=0, prompt="go")]


def _run(env: Environment, reply: str) -> Trace:
    client = ScriptedClient(ScriptedClientConfig(replies=[reply, "done"]))
    return asyncio.run(env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=8), scoring_timeout=5))


class Box:
    """A tool class whose tool's sandbox has died."""

    def run(self, code: str) -> str:
        """Run code.

        Args:
            code: The program.
        """
        raise SandboxDied("the sandbox stopped answering")


class FailingSetup(Environment):
    async def setup(self, state) -> None:
        raise SandboxStartError("bubblewrap is not installed")


async def oom_judge(completion: str) -> float:
    raise SandboxOOM("the verdict ran out of memory")


@pytest.mark.parametrize(
    ("env", "reply", "error_type"),
    [
        (FailingSetup(tasks=TASKS, rubric=Rubric({oom_judge: 1.0})), "x", "sandbox_start"),
        (
            ToolEnvironment(tool_class=Box, tasks=TASKS),
            '<tool_call>{"name": "run", "arguments": {"code": "1"}}</tool_call>',
            "sandbox_died",
        ),
        (Environment(tasks=TASKS, rubric=Rubric({oom_judge: 1.0})), "x", "sandbox_oom"),
    ],
)
def test_a_sandbox_failure_is_an_error_trace_of_its_type(env: Environment, reply: str, error_type: str) -> None:
    trace = _run(env, reply)
    assert trace.reward is None and trace.error is not None
    assert trace.error.type == error_type, trace.error
