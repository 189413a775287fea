"""openenv-count: the OpenEnv server in `server.py`, trained through envrl's OpenEnv adapter.

Guarantee: the glue is the whole port: observation -> messages, completion -> action, and where
the reward comes from; envrl starts the server as its env server's child unless `url` names one.
"""

from __future__ import annotations

from envrl.envs.adapters.openenv import OpenEnvEnvironment

SYSTEM_PROMPT = "Continue the count. Answer with numbers only."


def load_environment(
    url: str | None = None,
    turns: int = 1,
    reward: str = "steps",
    num_tasks: int = 1024,
    max_sessions: int | None = None,
) -> OpenEnvEnvironment:
    """`url`: a running server (`uvicorn openenv_count.server:app`); default: envrl starts one.
    `max_sessions`: sessions each env worker holds at once (the server allows 8 in all)."""
    return OpenEnvEnvironment(
        url=url,
        app=None if url else "openenv_count.server:app",
        observation=lambda obs: obs["prompt"] or [],  # the last observation (done) has no prompt
        action=lambda completion: {"message": completion},
        reward=reward,  # type: ignore[arg-type]
        reset_args=lambda task: {"seed": task.seed, "turns": turns},  # type: ignore[attr-defined]
        max_turns=turns,
        max_sessions=max_sessions,
        num_tasks=num_tasks,
        system_prompt=SYSTEM_PROMPT,
    )
