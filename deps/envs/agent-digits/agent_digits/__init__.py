"""agent-digits: a black-box agent program (agent.py, plain OpenAI SDK, two model calls: a draft,
then a revision) trained as it is; reward = share of digits in the answer it prints.

Guarantee: the environment knows the program only by its command; every model call the program
makes is a trained turn (envrl's chat proxy, docs/adapters.md "Agent programs"). With `sandbox`
(a `SandboxConfig` as a dict, `{}` for the defaults) each run is in a sandbox of its own, on the
system python with the `openai` SDK (a venv built once per machine, envrl.sandbox.venv).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from envrl.envs import Rubric, SandboxConfig, Task, sandbox_venv
from envrl.envs.adapters.agent_program import AgentProgramEnvironment

AGENT = Path(__file__).with_name("agent.py")


class DigitsTask(Task):
    question: str


def digit_share(answer: str | None) -> float:
    """Share of the answer's non-space characters that are digits (0 for an empty answer)."""
    chars = [c for c in answer or "" if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def make_tasks(count: int, offset: int) -> list[DigitsTask]:
    return [DigitsTask(idx=i, question=f"Write some numbers, please (#{offset + i}).") for i in range(count)]


def load_environment(
    num_train: int = 256,
    num_eval: int = 32,
    timeout_s: float = 120.0,
    sandbox: dict[str, Any] | None = None,
    warm: int = 0,
) -> AgentProgramEnvironment:
    """`sandbox`: run the program sandboxed (a `SandboxConfig` as a dict); `warm`: sandboxes kept started."""
    where: dict[str, Any] = {"command": [sys.executable, str(AGENT)]}
    if sandbox is not None:
        venv = sandbox_venv(["openai"])
        python = venv / "bin" / "python"
        config = SandboxConfig.model_validate({"python": python, "image": [Path("/usr"), venv], **sandbox})
        where = {"command": [str(python), "agent.py"], "sandbox": config, "files": {"agent.py": AGENT.read_text()}}
    return AgentProgramEnvironment(
        tasks=lambda: make_tasks(num_train, 0),
        eval_tasks=lambda: make_tasks(num_eval, num_train),
        rubric=Rubric({digit_share: 1.0}),
        timeout_s=timeout_s,
        warm=warm,
        **where,
    )
