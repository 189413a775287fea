"""Train envs whose server is this process, for the scheduler and loop tests: each call answers
at once (or hangs until cancelled), with rollouts whose tokens carry chosen policy steps."""

import asyncio

from envrl.data.traces import Branch, Error, Trace, Turn, TurnTokens, WireTask
from envrl.envclient.config import DeclaredEnvConfig
from envrl.envclient.handles import EnvHandle
from envrl.model.client import SamplingParams, ScriptedClientConfig


class AnsweringEnv(EnvHandle):
    """A train env whose server is this process: call k answers at once, unless k is in `hang`."""

    def __init__(self, hang: frozenset[int] = frozenset()) -> None:
        super().__init__(
            DeclaredEnvConfig(id="x"),
            split="train",
            client=ScriptedClientConfig(),
            sampling=SamplingParams(),
            ready_timeout=1.0,
        )
        self.num_tasks = 8
        self.hang = hang
        self.calls: list[tuple[int, int]] = []
        """(task index, seed) of each call."""
        self.cancelled: list[int] = []
        """Calls cancelled while hanging."""

    async def run_group(self, task_idx: int, n: int, seed: int, attempt: int = 0) -> list[Trace]:
        call = len(self.calls)
        self.calls.append((task_idx, seed))
        if call in self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(call)
                raise
        return [Trace(task=WireTask(idx=task_idx), reward=1.0) for _ in range(n)]


def labelled_trace(task_idx: int, steps: list[int | None]) -> Trace:
    """A rollout of one turn whose completion tokens were sampled by policies `steps`."""
    tokens = TurnTokens(
        prompt_ids=[1],
        completion_ids=[2] * len(steps),
        completion_logprobs=[-1.0] * len(steps),
        completion_policy_steps=steps,
    )
    turn = Turn(prompt=[], response={"role": "assistant", "content": ""}, tokens=tokens)
    return Trace(task=WireTask(idx=task_idx), branches=[Branch(turns=[turn])], reward=1.0)


class LabelledEnv(AnsweringEnv):
    """Call k answers with rollouts whose tokens come from the policies `steps[k]` (one list per rollout)."""

    def __init__(self, steps: list[list[list[int | None]]], hang: frozenset[int] = frozenset()) -> None:
        super().__init__(hang)
        self.steps = steps

    async def run_group(self, task_idx: int, n: int, seed: int, attempt: int = 0) -> list[Trace]:
        call = len(self.calls)
        await super().run_group(task_idx, n, seed, attempt)
        return [labelled_trace(task_idx, steps) for steps in self.steps[call]]


class InfraFailingEnv(AnsweringEnv):
    """Like AnsweringEnv, but the first rollout of each call in `fail` died with its worker
    (`worker_died`); `group_scoring` as the env server would report it."""

    def __init__(self, fail: frozenset[int], group_scoring: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.group_scoring = group_scoring
        self.attempts: list[int] = []
        """`attempt` of each call (a refill samples past the attempts made before it)."""

    async def run_group(self, task_idx: int, n: int, seed: int, attempt: int = 0) -> list[Trace]:
        call = len(self.calls)
        self.attempts.append(attempt)
        traces = await super().run_group(task_idx, n, seed, attempt)
        if call in self.fail:
            traces[0] = Trace.from_error(WireTask(idx=task_idx), Error(type="worker_died", message="SIGKILL"))
        return traces
