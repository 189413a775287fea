"""The rollout loop: turns and tokens recorded, stop conditions, branches, failures as error Traces."""

import asyncio
from itertools import pairwise
from typing import Any

import pytest

from envrl.data.traces import Message, Task, Trace, TurnTokens
from envrl.envs import (
    Environment,
    ModelClient,
    ModelResponse,
    RolloutState,
    Rubric,
    SamplingArgs,
    ScriptedClient,
    ScriptedClientConfig,
)
from envrl.model.inference import ContextLengthError
from tests.support.tiny_chat import TINY_CHAT

SAMPLING = SamplingArgs(max_tokens=16)


class EchoTask(Task):
    prompt: str


TASKS = [EchoTask(idx=i, prompt=f"say {i}") for i in range(3)]


class Nagging(Environment):
    """Replies "again" until the model says "done"."""

    async def env_response(self, state: RolloutState) -> list[Message]:
        if "done" in state.completion:
            state.stop("completed")
            return []
        return [{"role": "user", "content": "again"}]


class Compacting(Nagging):
    """Replaces the history by a summary before each new turn: the next turn cannot extend."""

    async def env_response(self, state: RolloutState) -> list[Message]:
        new = await super().env_response(state)
        if new:
            state.messages[:] = [{"role": "user", "content": f"summary of {len(state.messages)} messages"}]
        return new


def scripted(*replies: str, tokens: bool = True, **config: Any) -> ScriptedClient:
    return ScriptedClient(
        ScriptedClientConfig(replies=list(replies), tokenizer=TINY_CHAT if tokens else None, **config)
    )


def run(env: Environment, client: ModelClient, **kwargs: Any) -> Trace:
    return asyncio.run(env.run_rollout(env.get_task("train", 0), client, SAMPLING, **kwargs))


def test_single_turn_rollout_records_the_turn_tokens_and_timing() -> None:
    trace = run(Environment(tasks=TASKS, system_prompt="Be brief."), scripted("hi there"))
    assert trace.error is None and trace.stop_reason == "completed" and not trace.is_truncated
    assert trace.num_turns == 1 and len(trace.branches) == 1
    turn = trace.turns[0]
    assert turn.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "say 0"}]
    assert turn.response == {"role": "assistant", "content": "hi there"}
    assert len(turn.tokens.completion_ids) == len(turn.tokens.completion_logprobs) == trace.completion_len > 0
    assert trace.timing.setup and trace.timing.generation and trace.timing.scoring
    assert trace.task.idx == 0 and trace.task.model_extra == {"prompt": "say 0"}


def test_multi_turn_turns_extend_one_branch_token_by_token() -> None:
    trace = run(Nagging(tasks=TASKS, max_turns=5), scripted("no", "still no", "done"))
    assert trace.stop_reason == "completed" and trace.num_turns == 3 and len(trace.branches) == 1
    for before, after in pairwise(trace.turns):
        context = before.tokens.prompt_ids + before.tokens.completion_ids
        assert after.tokens.prompt_ids[: len(context)] == context
        assert after.prompt == [*before.prompt, before.response, {"role": "user", "content": "again"}]


def test_max_turns_bounds_a_multi_turn_rollout() -> None:
    trace = run(Nagging(tasks=TASKS, max_turns=2), scripted("no"))
    assert trace.num_turns == 2 and trace.stop_reason == "max_turns" and trace.is_truncated


def test_a_completion_cut_off_by_max_tokens_ends_the_rollout_truncated() -> None:
    trace = run(Nagging(tasks=TASKS, max_turns=5), scripted("no", finish_reason="length"))
    assert trace.num_turns == 1 and trace.stop_reason == "max_tokens" and trace.is_truncated
    assert trace.turns[0].finish_reason == "length"


def test_a_turn_that_cannot_extend_the_branch_starts_a_new_one() -> None:
    trace = run(Compacting(tasks=TASKS, max_turns=5), scripted("no", "done"))
    assert [len(b.turns) for b in trace.branches] == [1, 1]
    assert trace.branches[1].turns[0].prompt[0]["content"].startswith("summary")


def test_token_less_turns_branch_by_messages() -> None:
    assert [
        len(b.turns) for b in run(Nagging(tasks=TASKS, max_turns=5), scripted("no", "done", tokens=False)).branches
    ] == [2]
    assert [
        len(b.turns) for b in run(Compacting(tasks=TASKS, max_turns=5), scripted("no", "done", tokens=False)).branches
    ] == [1, 1]


class Broken(Environment):
    def __init__(self, where: str) -> None:
        super().__init__(tasks=TASKS, max_turns=3)
        self.where = where

    def prompt(self, task: Task) -> list[Message]:
        if self.where == "prompt":
            raise KeyError("no prompt field")
        return super().prompt(task)

    async def setup(self, state: RolloutState) -> None:
        if self.where == "setup":
            raise RuntimeError("sandbox unavailable")

    async def env_response(self, state: RolloutState) -> list[Message]:
        if self.where == "env_response":
            raise ValueError("bad move")
        return await super().env_response(state)


class FailingClient(ModelClient):
    async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
        raise ConnectionError("inference server is down")


@pytest.mark.parametrize("where", ["prompt", "setup", "env_response"])
def test_exceptions_in_env_hooks_become_error_traces(where: str) -> None:
    trace = run(Broken(where), scripted("x"), scoring_timeout=5.0)
    assert trace.has_error and trace.reward is None and trace.stop_reason == "error"
    assert trace.error.type in ("KeyError", "RuntimeError", "ValueError") and trace.error.traceback


def test_a_failing_model_client_becomes_an_error_trace() -> None:
    trace = run(Environment(tasks=TASKS), FailingClient())
    assert trace.error.type == "ConnectionError" and "inference server is down" in trace.error.message


def test_rollout_generates_without_scoring() -> None:
    def chars(completion: str) -> float:
        return float(len(completion))

    env = Environment(tasks=TASKS, rubric=Rubric({chars: 1.0}))
    trace = asyncio.run(env.rollout(env.get_task("train", 1), scripted("abc"), SAMPLING))
    assert trace.reward is None and trace.error is None and trace.num_turns == 1


def test_run_group_gives_each_rollout_its_own_seed() -> None:
    seen: list[int | None] = []

    class SeedRecorder(ModelClient):
        async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
            seen.append(sampling.seed)
            return ModelResponse(message={"role": "assistant", "content": "x"})

    env = Environment(tasks=TASKS)
    traces = asyncio.run(
        env.run_group(env.get_task("train", 2), SeedRecorder(), SAMPLING.model_copy(update={"seed": 10}), 3)
    )
    assert sorted(seen) == [10, 11, 12] and len(traces) == 3 and all(t.task.idx == 2 for t in traces)


def test_each_model_call_of_a_rollout_samples_with_its_own_seed() -> None:
    """Reusing the rollout's seed for every turn would repeat the first turn's random draws."""
    seen: list[int | None] = []

    class SeedRecorder(ModelClient):
        async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
            seen.append(sampling.seed)
            return ModelResponse(message={"role": "assistant", "content": "done" if len(seen) % 3 == 0 else "x"})

    env = Nagging(tasks=TASKS, max_turns=3)
    for seed in (10, 11):
        asyncio.run(
            env.run_rollout(env.get_task("train", 0), SeedRecorder(), SAMPLING.model_copy(update={"seed": seed}))
        )
    first, second = seen[:3], seen[3:]
    assert first[0] == 10 and second[0] == 11, "the first call keeps the rollout's seed"
    assert len(set(seen)) == 6, f"every call of both rollouts has a seed of its own: {seen}"
    again: list[int | None] = []
    seen = again
    asyncio.run(env.run_rollout(env.get_task("train", 0), SeedRecorder(), SAMPLING.model_copy(update={"seed": 10})))
    assert again == first, "the seeds are a function of the rollout's seed and the call's index"


def test_a_rollout_that_never_reached_the_model_is_not_rewarded() -> None:
    """A prompt that does not fit ends the rollout before any model turn: rewards that apply to an
    empty episode must not score it (it would enter the group's baseline as if the model acted)."""

    class TooLong(ModelClient):
        async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
            raise ContextLengthError("prompt of 636 tokens does not fit max_model_len 512")

    env = Environment(tasks=TASKS, rubric=Rubric({lambda completion: 1.0 + len(completion): 1.0}))
    trace = run(env, TooLong())
    assert trace.num_turns == 0 and trace.stop_reason == "context_length"
    assert trace.reward is None and trace.error is None and trace.metrics == {}


def test_cancelling_a_rollout_propagates_and_still_cleans_up() -> None:
    cleaned: list[int] = []

    class Tracked(Environment):
        async def cleanup(self, state: RolloutState) -> None:
            cleaned.append(state.task.idx)

    async def main() -> None:
        env = Tracked(tasks=TASKS)
        rollout = asyncio.create_task(
            env.run_rollout(env.get_task("train", 0), scripted("x", tokens=False, delay_s=30.0), SAMPLING)
        )
        await asyncio.sleep(0.05)
        rollout.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollout

    asyncio.run(main())
    assert cleaned == [0]


def test_tasks_are_built_lazily_and_checked_for_their_index() -> None:
    built: list[str] = []

    def make() -> list[EchoTask]:
        built.append("train")
        return [EchoTask(idx=0, prompt="a"), EchoTask(idx=5, prompt="b")]

    env = Environment(tasks=make, eval_tasks=TASKS)
    assert built == [] and env.num_tasks("eval") == 3
    with pytest.raises(ValueError, match="position 1 has idx 5"):
        env.num_tasks("train")
    with pytest.raises(IndexError, match="valid indices are 0..2"):
        env.get_task("eval", 3)


class FiveTokens(ModelClient):
    """Answers with five tokens, or `max_tokens` of them (finish_reason "length") if fewer; records max_tokens."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def generate(self, messages: list[Message], sampling: SamplingArgs, **kwargs: Any) -> ModelResponse:
        self.asked.append(sampling.max_tokens)
        n = min(5, sampling.max_tokens)
        tokens = TurnTokens(
            prompt_ids=[1] * (10 * len(self.asked)), completion_ids=[7] * n, completion_logprobs=[-1.0] * n
        )
        return ModelResponse(
            message={"role": "assistant", "content": "x"}, tokens=tokens, finish_reason="stop" if n == 5 else "length"
        )


@pytest.mark.parametrize(("budget", "asked", "generated"), [(12, [12, 7, 2], 12), (10, [10, 5], 10)])
def test_the_episode_token_budget_caps_turns_and_ends_the_rollout_as_truncated(
    budget: int, asked: list[int], generated: int
) -> None:
    env = Nagging(tasks=TASKS, max_turns=10)
    client = FiveTokens()
    trace = asyncio.run(
        env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=16, max_episode_tokens=budget))
    )
    assert trace.error is None and client.asked == asked and trace.completion_len == generated
    assert (trace.stop_reason, trace.is_truncated) == ("episode_tokens", True)
