"""agent-digits: a black-box agent program (agent.py, plain OpenAI SDK, two model calls: a draft,
then a revision) trained as it is; reward = share of digits in the answer it prints.

Guarantee: the environment knows the program only by its command; every model call the program
makes is a trained turn (envrl's chat proxy, docs/adapters.md "Agent programs").
"""

from __future__ import annotations

import sys
from pathlib import Path

from envrl.envs import Rubric
from envrl.envs.adapters.agent_program import AgentProgramEnvironment
from envrl.traces import Task

AGENT = Path(__file__).with_name("agent.py")


class DigitsTask(Task):
    question: str


def digit_share(answer: str | None) -> float:
    """Share of the answer's non-space characters that are digits (0 for an empty answer)."""
    chars = [c for c in answer or "" if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def make_tasks(count: int, offset: int) -> list[DigitsTask]:
    return [DigitsTask(idx=i, question=f"Write some numbers, please (#{offset + i}).") for i in range(count)]


def load_environment(num_train: int = 256, num_eval: int = 32, timeout_s: float = 120.0) -> AgentProgramEnvironment:
    return AgentProgramEnvironment(
        command=[sys.executable, str(AGENT)],
        tasks=lambda: make_tasks(num_train, 0),
        eval_tasks=lambda: make_tasks(num_eval, num_train),
        rubric=Rubric({digit_share: 1.0}),
        timeout_s=timeout_s,
    )
