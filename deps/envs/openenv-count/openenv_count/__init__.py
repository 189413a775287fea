"""openenv-count: the OpenEnv server in `server.py`, trained through envrl's OpenEnv adapter.

Guarantee: the glue is the whole port: observation -> messages, completion -> action, and where
the reward comes from; envrl starts the server as its env server's child unless `url` names one.
"""

from __future__ import annotations

from typing import Any

from envrl.envs.adapters.openenv import OpenEnvEnvironment

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."
MCP_PROMPT = SYSTEM_PROMPT + " The next_numbers tool can help."


def _answer(completion: str) -> dict[str, Any]:
    """A reply without a tool call, as the MCP server's `answer` tool call."""
    return {"type": "call_tool", "tool_name": "answer", "arguments": {"text": completion}}


def load_environment(
    url: str | None = None,
    turns: int = 1,
    reward: str = "steps",
    num_tasks: int = 1024,
    max_sessions: int | None = None,
    mcp: bool = False,
    max_turns: int | None = None,
) -> OpenEnvEnvironment:
    """`url`: a running server (`uvicorn openenv_count.server:app`); default: envrl starts one.
    `max_sessions`: sessions each env worker holds at once (the server allows 8 in all).
    `mcp`: the MCP-mode server (mcp_server.py: tools `next_numbers` and `answer`; a reply
    without a tool call is given to `answer`);
    `max_turns` (default `turns`, or 3 with `mcp`) bounds the model turns, tool calls included."""
    server = "openenv_count.mcp_server:app" if mcp else "openenv_count.server:app"
    return OpenEnvEnvironment(
        url=url,
        app=None if url else server,
        mcp=mcp,
        observation=lambda obs: obs.get("prompt") or [],  # the last observation (done, or a tool's) has none
        action=_answer if mcp else lambda completion: {"message": completion},
        reward=reward,  # type: ignore[arg-type]
        reset_args=lambda task: {"seed": task.seed, "turns": turns},  # type: ignore[attr-defined]
        max_turns=max_turns or (3 if mcp else turns),
        max_sessions=max_sessions,
        num_tasks=num_tasks,
        system_prompt=MCP_PROMPT if mcp else SYSTEM_PROMPT,
    )
