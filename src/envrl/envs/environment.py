"""The Environment base: its tasks and the hooks an env author overrides; `rollout` and `run_group` (run by
envs/runner.py) never raise (cancellation aside): any failure is `Trace.error` with reward None."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from envrl.data.traces import Message, Split, Task, Trace
from envrl.envs import runner
from envrl.envs.rubric import Rubric
from envrl.envs.state import RolloutState
from envrl.model.client import ModelClient, SamplingArgs

TaskSource = Sequence[Task] | Callable[[], Iterable[Task]]
"""A list of tasks, or a function that builds them (from a seed, no downloads) on first use."""


class Environment:
    """Subclass hooks: `prompt`, `setup`, `env_response` (multi-turn), `tools`, `cleanup`."""

    def __init__(
        self,
        *,
        tasks: TaskSource,
        eval_tasks: TaskSource = (),
        rubric: Rubric | None = None,
        system_prompt: str | None = None,
        max_turns: int = 1,
        stop_on_length: bool = True,
    ) -> None:
        """`stop_on_length=False`: a turn cut off by `max_tokens` does not end the rollout; the
        env answers it like any other (the next prompt closes the cut turn with eos)."""
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self._sources: dict[Split, TaskSource] = {"train": tasks, "eval": eval_tasks}
        self._tasks: dict[Split, list[Task]] = {}
        self.rubric = rubric or Rubric()
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.stop_on_length = stop_on_length
        self.env_id = type(self).__name__
        """The id it was loaded by (set by `load_environment`)."""

    # -- tasks -------------------------------------------------------------------------------

    def task_list(self, split: Split) -> list[Task]:
        """The split's tasks, built on first use; `tasks[i].idx == i` is checked once."""
        if split not in self._sources:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'eval'")
        if split not in self._tasks:
            source = self._sources[split]
            tasks = list(source() if callable(source) else source)
            for position, task in enumerate(tasks):
                if task.idx != position:
                    raise ValueError(
                        f"{self.env_id}: {split} task at position {position} has idx {task.idx}; idx must be its position"
                    )
            self._tasks[split] = tasks
        return self._tasks[split]

    @property
    def tasks(self) -> list[Task]:
        return self.task_list("train")

    @property
    def eval_tasks(self) -> list[Task]:
        return self.task_list("eval")

    def num_tasks(self, split: Split) -> int:
        return len(self.task_list(split))

    def get_task(self, split: Split, idx: int) -> Task:
        tasks = self.task_list(split)
        if not 0 <= idx < len(tasks):
            raise IndexError(f"{self.env_id}: no {split} task {idx}; valid indices are 0..{len(tasks) - 1}")
        return tasks[idx]

    @property
    def group_scoring(self) -> bool:
        """True if the rubric has group reward functions: score rollouts through `run_group`."""
        return self.rubric.group_scoring

    # -- hooks -------------------------------------------------------------------------------

    def prompt(self, task: Task) -> list[Message]:
        """The initial messages: the system prompt, then the task's `prompt` (text or messages)."""
        question = getattr(task, "prompt", None)
        if question is None:
            raise NotImplementedError(f"{type(self).__name__}: give tasks a `prompt` field or override prompt(task)")
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + ([{"role": "user", "content": question}] if isinstance(question, str) else list(question))

    def tools(self, state: RolloutState) -> list[dict[str, Any]] | None:
        """OpenAI-style tool schemas shown to the model (None: no tools)."""
        return None

    async def setup(self, state: RolloutState) -> None:
        """Per-rollout preparation before the first model call."""

    async def env_response(self, state: RolloutState) -> list[Message]:
        """After each model turn: the env's reply messages, or `state.stop(...)`. Default: one turn.

        Messages returned together with `state.stop(...)` end the episode: they are stored in
        `Trace.trailing_messages`."""
        state.stop("completed")
        return []

    async def cleanup(self, state: RolloutState) -> None:
        """After scoring (also after a failure or cancellation): release per-rollout resources."""

    # -- running -----------------------------------------------------------------------------

    async def episode(self, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
        """The model calls of one rollout, each recorded in `state.trace` (an exception fails the
        rollout). Default: the turn loop (`prompt`, then model turn / `env_response` until a stop);
        an env that drives the model some other way (an agent program) overrides it."""
        await runner.turn_loop(self, state, client, sampling)

    # -- entry points (envs/runner.py runs them) ---------------------------------------------

    async def rollout(self, task: Task, client: ModelClient, sampling: SamplingArgs) -> Trace:
        """Generate one rollout without scoring it (failures become `Trace.error`)."""
        return await runner.rollout(self, task, client, sampling)

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        """`n` rollouts of one task, scored together (n = 1: one rollout). With a seed, rollout i
        samples with seed + i. The one entry point an env server calls: override this one."""
        return await runner.run_group(self, task, client, sampling, n, scoring_timeout=scoring_timeout)

    async def run_rollout(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, *, scoring_timeout: float | None = None
    ) -> Trace:
        """One scored rollout: `run_group` with n = 1."""
        (trace,) = await self.run_group(task, client, sampling, 1, scoring_timeout=scoring_timeout)
        return trace
