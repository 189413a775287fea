"""TRL `environment_factory` classes and reward functions, ported by changing imports only: the conventions of TRL
1.16's GRPOTrainer hold (docs/adapters.md)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import ConfigDict

from envrl.data.traces import Message, Task
from envrl.envs.rubric import GroupRewardFn, Rubric
from envrl.envs.state import RolloutState
from envrl.envs.tools import ToolEnvironment

NOT_TOOLS = ("reset", "get_reward")
"""What TRL never offers the model as a tool."""
NOT_COLUMNS = ("idx", "prompt", "completion", "completion_ids")
"""Task fields TRL does not pass to reward functions as columns."""

Dataset = Sequence[Mapping[str, Any]] | Callable[[], Iterable[Mapping[str, Any]]]
"""Rows with a `prompt` (text or messages) and any other columns: a list, a `datasets.Dataset`, or
a function that builds them on first use."""


class TrlRow(Task):
    """One dataset row; its columns are the task's fields."""

    model_config = ConfigDict(extra="allow")


class TrlEnvironment(ToolEnvironment):
    """`TrlEnvironment(dataset=..., environment_factory=MyEnv, reward_funcs=[...])`; see docs/adapters.md.

    `reward_weights` are TRL's `GRPOConfig.reward_weights` (default 1 each; 0 makes a metric);
    `max_turns` bounds the model turns (TRL's `max_tool_calling_iterations` + 1).
    """

    def __init__(
        self,
        *,
        dataset: Dataset,
        environment_factory: Callable[[], Any],
        reward_funcs: Sequence[Callable[..., Any]] = (),
        reward_weights: Sequence[float] | None = None,
        eval_dataset: Dataset = (),
        max_turns: int = 8,
        **kwargs: Any,
    ) -> None:
        probe = environment_factory()  # TRL probes one instance too: its class gives the tools
        if not callable(getattr(probe, "reset", None)):
            raise TypeError(f"{type(probe).__name__}: an environment_factory's instances must define reset()")
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs)
        if len(weights) != len(reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values for {len(reward_funcs)} reward_funcs")
        group: dict[GroupRewardFn, float] = {_batched(fn): w for fn, w in zip(reward_funcs, weights, strict=True)}
        if callable(getattr(probe, "get_reward", None)):
            group[_env_reward(type(probe))] = 1.0
        if not group:
            raise ValueError("no reward source: pass reward_funcs, or give the environment class a get_reward() method")
        super().__init__(
            tool_class=type(probe),
            factory=environment_factory,
            tasks=_rows(dataset),
            eval_tasks=_rows(eval_dataset),
            rubric=Rubric(group=group),
            max_turns=max_turns,
            **kwargs,
        )
        for name in NOT_TOOLS:
            self.tool_by_name.pop(name, None)
        self.schemas = [tool.schema for tool in self.tool_by_name.values()]

    async def setup(self, state: RolloutState) -> None:
        state.env = self.factory()
        observation = state.env.reset(**_row(state.task))
        if inspect.isawaitable(observation):
            observation = await observation
        if observation is None:
            return
        if not isinstance(observation, str) or not state.messages:
            raise TypeError(
                f"{type(state.env).__name__}.reset() returned {type(observation).__name__}; "
                "envrl supports None or a string (appended to the last prompt message)"
            )
        last = state.messages[-1]
        appended: Message = {**last, "content": (last.get("content") or "") + observation}
        state.messages[-1] = appended
        state.prompt[-1] = appended


def _row(task: Task) -> dict[str, Any]:
    """The dataset row a task was made from (what TRL passes to `reset`)."""
    return {name: value for name, value in task.model_dump().items() if name != "idx"}


def _rows(dataset: Dataset) -> Callable[[], list[Task]]:
    def build() -> list[Task]:
        rows = dataset() if callable(dataset) else dataset
        return [TrlRow(idx=i, **dict(row)) for i, row in enumerate(rows)]

    return build


def _ignored(*args: Any, **kwargs: Any) -> None:
    """`log_extra` / `log_metric`: TRL's logging hooks, accepted so that reward functions run unchanged."""


def _trl_kwargs(states: list[RolloutState]) -> dict[str, Any]:
    """The keyword arguments TRL passes a reward function, for one group."""
    columns = {name: value for name, value in _row(states[0].task).items() if name not in NOT_COLUMNS}
    return {
        "prompts": [s.prompt for s in states],
        "completions": [s.messages[len(s.prompt) :] for s in states],
        "completion_ids": [
            [
                i
                for branch in s.trace.branches
                for turn in branch.turns
                if turn.tokens
                for i in turn.tokens.completion_ids
            ]
            for s in states
        ],
        **{name: [value] * len(states) for name, value in columns.items()},
        "environments": [s.env for s in states],
        "trainer_state": None,
        "log_extra": _ignored,
        "log_metric": _ignored,
    }


def _batched(fn: Callable[..., Any]) -> GroupRewardFn:
    """`fn` as an envrl group reward function (named like `fn`, so its metric is)."""
    if inspect.iscoroutinefunction(fn):

        async def group_reward(states: list[RolloutState]) -> list[float | None]:
            return list(await fn(**_trl_kwargs(states)))

    else:

        def group_reward(states: list[RolloutState]) -> list[float | None]:
            return list(fn(**_trl_kwargs(states)))

    group_reward.__name__ = getattr(fn, "__name__", type(fn).__name__)
    return group_reward


def _env_reward(cls: type) -> GroupRewardFn:
    """The class's `get_reward()` of each rollout's instance, as TRL adds it (named after the class)."""
    if inspect.iscoroutinefunction(cls.get_reward):

        async def env_reward(envs: list[Any]) -> list[float | None]:
            return [await env.get_reward() for env in envs]

    else:

        def env_reward(envs: list[Any]) -> list[float | None]:
            return [env.get_reward() for env in envs]

    env_reward.__name__ = cls.__name__
    return env_reward
