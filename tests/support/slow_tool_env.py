"""A tool environment with a slow tool and a fast one (loaded as 'slow_tool_env:load_environment'),
for the test that a slow tool shows up by name in the time ledger."""

from __future__ import annotations

import asyncio

from envrl.data.traces import Task
from envrl.envs import Rubric
from envrl.envs.tools import ToolEnvironment

CALLS = (
    '<tool_call>{"name": "slow_lookup", "arguments": {"key": "a"}}</tool_call>'
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
)
"""A reply that calls both tools once."""


class PromptTask(Task):
    prompt: str


class Tools:
    sleep_s = 0.0

    async def slow_lookup(self, key: str) -> str:
        """Look a key up, slowly.

        Args:
            key: the key.
        """
        await asyncio.sleep(self.sleep_s)
        return key

    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: the first.
            b: the second.
        """
        return str(a + b)


def one() -> float:
    return 1.0


def load_environment(sleep_s: float = 0.3) -> ToolEnvironment:
    Tools.sleep_s = sleep_s
    tasks = [PromptTask(idx=i, prompt=f"task {i}") for i in range(2)]
    return ToolEnvironment(tool_class=Tools, tasks=tasks, rubric=Rubric({one: 1.0}), max_turns=1)
