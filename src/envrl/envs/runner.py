"""Running an Environment's episodes: `run_group` and `rollout` never raise (cancellation aside), any failure is
`Trace.error` with reward None, `cleanup` runs for every state, and every model call is a Turn extending its Branch
only when its prompt extends it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from envrl.data.traces import Branch, Error, Message, Task, Trace, Turn, WireTask
from envrl.envs.state import RolloutState
from envrl.model.client import ModelClient, SamplingArgs
from envrl.model.inference import ContextLengthError

if TYPE_CHECKING:
    from envrl.envs.environment import Environment


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


async def rollout(env: Environment, task: Task, client: ModelClient, sampling: SamplingArgs) -> Trace:
    """One rollout of `task`, not scored."""
    state = new_state(env, task)
    try:
        await _generate(env, state, client, sampling)
        return state.trace
    finally:
        await _cleanup(env, state)


async def run_group(
    env: Environment,
    task: Task,
    client: ModelClient,
    sampling: SamplingArgs,
    n: int,
    *,
    scoring_timeout: float | None = None,
) -> list[Trace]:
    """`n` rollouts of one task, scored together by `env.rubric`; with a seed, rollout i samples
    with seed + i."""
    states = [new_state(env, task) for _ in range(n)]
    try:
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(n)]
        seeded = [sampling.model_copy(update={"seed": seed}) for seed in seeds]
        await asyncio.gather(*(_generate(env, s, client, args) for s, args in zip(states, seeded, strict=True)))
        if env.group_scoring:
            await env.rubric.score_group(states, scoring_timeout)
        else:  # each rollout's failures and deadline its own
            await asyncio.gather(*(env.rubric.score(s, scoring_timeout) for s in states))
        return [s.trace for s in states]
    finally:
        await asyncio.gather(*(_cleanup(env, s) for s in states))


def new_state(env: Environment, task: Task) -> RolloutState:
    """A rollout's state before its first model call (failed already if `env.prompt` raised)."""
    trace = Trace(task=WireTask.model_validate(task.model_dump()))
    try:
        prompt = env.prompt(task)
    except Exception as e:  # noqa: BLE001 - becomes the trace's error
        state = RolloutState(task=task, prompt=[], trace=trace)
        fail(state, e)
        return state
    return RolloutState(task=task, prompt=prompt, trace=trace)


async def turn_loop(env: Environment, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
    """The default episode: model turn, then `env.env_response`, until a stop, `max_turns`, the
    episode's token budget or the model's context ends it."""
    trace = state.trace
    while not state.done:
        if trace.num_turns >= env.max_turns:
            state.stop("max_turns", truncated=True)
            break
        turn_sampling = _turn_sampling(trace, sampling)
        if turn_sampling is None:
            state.stop("episode_tokens", truncated=True)
            break
        previous = state.last_turn
        tools = env.tools(state)
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
            if budget_hit or env.stop_on_length:
                state.stop("episode_tokens" if budget_hit else "max_tokens", truncated=True)
                break
        state.messages.extend(await env.env_response(state))


def fail(state: RolloutState, exc: Exception) -> None:
    """End the rollout with `exc` as its error (no reward)."""
    state.trace.error = Error.from_exception(exc)
    state.trace.reward = None
    state.stop_reason = state.trace.stop_reason = "error"


async def _generate(env: Environment, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
    if state.trace.has_error:
        return
    try:
        with state.trace.timing.measure("setup"):
            await env.setup(state)
        with state.trace.timing.measure("generation"):
            await env.episode(state, client, sampling)
        state.trace.trailing_messages = _trailing(state)
    except Exception as e:  # noqa: BLE001 - never raise: the failure is the trace's error
        fail(state, e)


def _trailing(state: RolloutState) -> list[Message]:
    """The messages after the last model turn (all of them if the env rewrote the history)."""
    last = state.last_turn
    if last is None:
        return []
    seen = [*last.prompt, last.response]
    return list(state.messages[len(seen) :] if state.messages[: len(seen)] == seen else state.messages)


def _turn_sampling(trace: Trace, sampling: SamplingArgs) -> SamplingArgs | None:
    """The next turn's sampling: `max_tokens` capped by the episode budget; None once it is spent."""
    if sampling.max_episode_tokens is None:
        return sampling
    left = sampling.max_episode_tokens - trace.completion_len
    if left <= 0:
        return None
    return sampling if left >= sampling.max_tokens else sampling.model_copy(update={"max_tokens": left})


async def _cleanup(env: Environment, state: RolloutState) -> None:
    try:
        await env.cleanup(state)
    except Exception as e:  # noqa: BLE001 - a cleanup failure must not hide the rollout's result
        if not state.trace.has_error:
            fail(state, e)
