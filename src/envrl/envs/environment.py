"""The Environment base: `rollout` and `run_group` never raise (cancellation aside), any failure is `Trace.error` with
reward None; every model call is a Turn with its tokens, continuing its Branch only when its prompt extends it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from envrl.data.traces import Branch, Error, Message, Split, Task, Trace, Turn, WireTask
from envrl.envs.rubric import Rubric
from envrl.envs.state import RolloutState
from envrl.model.client import ModelClient, SamplingArgs
from envrl.model.inference import ContextLengthError

TaskSource = Sequence[Task] | Callable[[], Iterable[Task]]
"""A list of tasks, or a function that builds them (from a seed, no downloads) on first use."""


def append_turn(trace: Trace, turn: Turn) -> None:
    """Record `turn`: it continues the last branch when its context extends that branch's last
    turn, else it starts a new branch."""
    previous = trace.branches[-1].turns[-1] if trace.branches and trace.branches[-1].turns else None
    if previous is None or not _extends(previous, turn):
        trace.branches.append(Branch())
    trace.branches[-1].turns.append(turn)


def _extends(previous: Turn, turn: Turn) -> bool:
    """Whether `turn`'s context continues `previous`'s (by tokens where both have them)."""
    if previous.tokens is not None and turn.tokens is not None:
        before = [*previous.tokens.prompt_ids, *previous.tokens.completion_ids]
        return turn.tokens.prompt_ids[: len(before)] == before
    if previous.tokens is None and turn.tokens is None:
        before_messages = [*previous.prompt, previous.response]
        return turn.prompt[: len(before_messages)] == before_messages
    return False


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

    async def rollout(self, task: Task, client: ModelClient, sampling: SamplingArgs) -> Trace:
        """Generate one rollout without scoring it (failures become `Trace.error`)."""
        state = self._new_state(task)
        try:
            await self._generate(state, client, sampling)
            return state.trace
        finally:
            await self._cleanup(state)

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        """`n` rollouts of one task, scored together (n = 1: one rollout). With a seed, rollout i
        samples with seed + i. The one entry point an env server calls: override this one."""
        states = [self._new_state(task) for _ in range(n)]
        try:
            seeds = [None if sampling.seed is None else sampling.seed + i for i in range(n)]
            seeded = [sampling.model_copy(update={"seed": seed}) for seed in seeds]
            await asyncio.gather(*(self._generate(s, client, args) for s, args in zip(states, seeded, strict=True)))
            if self.group_scoring:
                await self.rubric.score_group(states, scoring_timeout)
            else:  # each rollout's failures and deadline its own
                await asyncio.gather(*(self.rubric.score(s, scoring_timeout) for s in states))
            return [s.trace for s in states]
        finally:
            await asyncio.gather(*(self._cleanup(s) for s in states))

    async def run_rollout(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, *, scoring_timeout: float | None = None
    ) -> Trace:
        """One scored rollout: `run_group` with n = 1."""
        (trace,) = await self.run_group(task, client, sampling, 1, scoring_timeout=scoring_timeout)
        return trace

    def _new_state(self, task: Task) -> RolloutState:
        trace = Trace(task=WireTask.model_validate(task.model_dump()))
        try:
            prompt = self.prompt(task)
        except Exception as e:  # noqa: BLE001 - becomes the trace's error
            state = RolloutState(task=task, prompt=[], trace=trace)
            self._fail(state, e)
            return state
        return RolloutState(task=task, prompt=prompt, trace=trace)

    async def _generate(self, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
        if state.trace.has_error:
            return
        try:
            with state.trace.timing.measure("setup"):
                await self.setup(state)
            with state.trace.timing.measure("generation"):
                await self.episode(state, client, sampling)
            state.trace.trailing_messages = self._trailing(state)
        except Exception as e:  # noqa: BLE001 - never raise: the failure is the trace's error
            self._fail(state, e)

    @staticmethod
    def _trailing(state: RolloutState) -> list[Message]:
        """The messages after the last model turn (all of them if the env rewrote the history)."""
        last = state.last_turn
        if last is None:
            return []
        seen = [*last.prompt, last.response]
        return list(state.messages[len(seen) :] if state.messages[: len(seen)] == seen else state.messages)

    async def episode(self, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
        """The model calls of one rollout, each recorded in `state.trace` (an exception fails the
        rollout). Default: the turn loop (`prompt`, then model turn / `env_response` until a stop);
        an env that drives the model some other way (an agent program) overrides it."""
        trace = state.trace
        while not state.done:
            if trace.num_turns >= self.max_turns:
                state.stop("max_turns", truncated=True)
                break
            turn_sampling = self._turn_sampling(trace, sampling)
            if turn_sampling is None:
                state.stop("episode_tokens", truncated=True)
                break
            previous = state.last_turn
            tools = self.tools(state)
            call = turn_sampling.for_call(trace.num_turns)
            try:
                response = await client.generate(list(state.messages), call, tools=tools, previous=previous)
            except ContextLengthError:
                state.stop("context_length", truncated=True)
                break
            turn = Turn(
                prompt=list(state.messages),
                response=response.message,
                tokens=response.tokens,
                finish_reason=response.finish_reason,
                tools=tools,
            )
            append_turn(trace, turn)
            state.messages.append(response.message)
            if response.finish_reason == "length":
                budget_hit = turn_sampling.max_tokens < sampling.max_tokens
                if budget_hit or self.stop_on_length:
                    state.stop("episode_tokens" if budget_hit else "max_tokens", truncated=True)
                    break
            state.messages.extend(await self.env_response(state))

    @staticmethod
    def _turn_sampling(trace: Trace, sampling: SamplingArgs) -> SamplingArgs | None:
        """The next turn's sampling: `max_tokens` capped by the episode budget; None once it is spent."""
        if sampling.max_episode_tokens is None:
            return sampling
        left = sampling.max_episode_tokens - trace.completion_len
        if left <= 0:
            return None
        return sampling if left >= sampling.max_tokens else sampling.model_copy(update={"max_tokens": left})

    def _fail(self, state: RolloutState, exc: Exception) -> None:
        state.trace.error = Error.from_exception(exc)
        state.trace.reward = None
        state.stop_reason = state.trace.stop_reason = "error"

    async def _cleanup(self, state: RolloutState) -> None:
        try:
            await self.cleanup(state)
        except Exception as e:  # noqa: BLE001 - a cleanup failure must not hide the rollout's result
            if not state.trace.has_error:
                self._fail(state, e)
