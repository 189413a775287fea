"""code-exec: write Python that prints a target value; the code runs only in a sandbox.

Guarantee: every rollout owns one sandbox (started in `reset`, closed in `close`, also on
cancel and timeout), model-written code runs nowhere else, and the reward is read from the final
program's run in the sandbox's clean room (`Sandbox.verdict`: written by the host after everything
the episode started is gone), so nothing the model ran earlier can touch the verdict. A sandbox failure is an error Trace of
its `sandbox_*` type; the program's own failures (an exception, a timeout, a limit, killing the
sandbox's agent) are the model's and score 0.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from envrl.envs import (
    BubblewrapProvider,
    Message,
    RolloutState,
    Rubric,
    Sandbox,
    SandboxConfig,
    SandboxProvider,
    Task,
    ToolEnvironment,
    WarmPool,
)
from envrl.sandbox import SandboxDied

SYSTEM_PROMPT = (
    "Write a Python program that prints the value asked for, and nothing else. You may test code with "
    "run_python. End with the final program in a ```python block."
)
RUN_TIMEOUT_S = 10.0
"""Per `run_python` call and for the final program."""
_FENCED = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


class CodeTask(Task):
    question: str
    target: str


def _tasks(count: int, seed: int) -> list[CodeTask]:
    rng = random.Random(seed)
    words = ["sandbox", "python", "reward", "episode", "namespace", "tensor", "gradient"]
    makers = [
        lambda n: (f"the sum of the integers from 1 to {n}", str(n * (n + 1) // 2)),
        lambda n: (f"{n % 20} factorial", str(math.factorial(n % 20))),
        lambda n: (f"the number of primes below {n}", str(sum(all(k % d for d in range(2, k)) for k in range(2, n)))),
        lambda n: (f"the word {words[n % len(words)]!r} reversed", words[n % len(words)][::-1]),
        lambda n: (f"{n} squared", str(n * n)),
    ]
    tasks = []
    for i in range(count):
        question, target = rng.choice(makers)(rng.randint(5, 200))
        tasks.append(CodeTask(idx=i, question=question, target=target))
    return tasks


def final_program(text: str) -> str:
    """The last ```python block of the model's final message, else the whole message."""
    blocks = _FENCED.findall(text)
    return blocks[-1] if blocks else text


class PythonSandbox:
    """The tool the model sees, over one episode's sandbox."""

    def __init__(self, provider: SandboxProvider, config: SandboxConfig) -> None:
        self.provider = provider
        self.config = config
        self.sandbox: Sandbox | None = None
        self.killed_by_code: str | None = None
        """Why the sandbox died under a run_python call (the episode then scores 0)."""

    async def reset(self, **task: Any) -> None:
        self.sandbox = await self.provider.create(self.config)

    async def run_python(self, code: str) -> str:
        """Run a Python program in a fresh file and show its exit status, stdout and stderr.

        Args:
            code: The whole program.
        """
        assert self.sandbox is not None
        if self.killed_by_code:
            return f"the sandbox is gone: {self.killed_by_code}"
        await self.sandbox.write_file("main.py", code)
        try:
            result = await self.sandbox.run(["python3", "main.py"], timeout=RUN_TIMEOUT_S)
        except (
            SandboxDied
        ) as e:  # the program killed the sandbox's agent: its doing, never an error Trace to hide behind
            self.killed_by_code = f"a run_python program killed it ({e})"
            return f"the sandbox is gone: {self.killed_by_code}"
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return f"{status}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.close()


async def printed_target(env: PythonSandbox, state: RolloutState, target: str) -> float:
    """1 if the final program, run in the sandbox's clean room, prints exactly `target`."""
    assert env.sandbox is not None
    if env.killed_by_code:
        state.trace.metrics["final_exit_ok"] = 0.0
        return 0.0
    program = {"final.py": final_program(state.completion)}
    result = await env.sandbox.verdict(["python3", "final.py"], program, timeout=RUN_TIMEOUT_S)
    state.trace.metrics["final_exit_ok"] = float(result.exit_code == 0)
    return float(result.stdout.strip() == target)


class CodeExecEnv(ToolEnvironment):
    def prompt(self, task: Task) -> list[Message]:
        assert isinstance(task, CodeTask)
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Print {task.question}."},
        ]


def load_environment(
    num_train: int = 500,
    num_eval: int = 50,
    seed: int = 0,
    max_turns: int = 4,
    sandbox: dict[str, Any] | None = None,
    warm: int = 0,
) -> CodeExecEnv:
    config = SandboxConfig.model_validate(sandbox or {})
    provider: SandboxProvider = BubblewrapProvider()
    if warm:
        provider = WarmPool(provider, config, size=warm)
    return CodeExecEnv(
        tool_class=PythonSandbox,
        factory=lambda: PythonSandbox(provider, config),
        tasks=lambda: _tasks(num_train, seed),
        eval_tasks=lambda: _tasks(num_eval, seed + 1),
        rubric=Rubric({printed_target: 1.0}),
        max_turns=max_turns,
    )
