"""The OpenEnv server in MCP mode: openenv-count's task as an `MCPEnvironment` whose actions are tool calls.

Guarantee: plain openenv-core (no envrl import): `reset(seed)` gives the same count start as
server.py; the tool `next_numbers(last, n)` returns the n numbers after `last` (no reward); the
tool `answer(text)` is rewarded with the text's share of digits and ends the episode. Actions are
OpenEnv's MCP actions (`list_tools`, `call_tool`) only.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Action, Observation
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import State

from openenv_count.server import MAX_CONCURRENT_ENVS, CountEnvironment, digit_share


class CountMCPEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        mcp = FastMCP("count")

        @mcp.tool
        def next_numbers(last: int, n: int = 3) -> str:
            """The `n` numbers after `last`, space-separated (n is capped at 10)."""
            return " ".join(str(last + i) for i in range(1, min(max(n, 1), 10) + 1))

        @mcp.tool
        def answer(text: str) -> str:
            """Give your final answer (ends the episode)."""
            return "received"

        super().__init__(mcp)
        self._count = CountEnvironment()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return self._count.reset(seed=seed, episode_id=episode_id)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """What the WebSocket session calls."""
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, observation: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "answer":
            observation.reward = digit_share(str(action.arguments.get("text", "")))
            observation.done = True
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise ValueError(f"count-mcp takes tool calls only (list_tools, call_tool), not {type(action).__name__}")

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    CountMCPEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="count-mcp",
    max_concurrent_envs=MAX_CONCURRENT_ENVS,
)
