"""Rewards: scoring never raises; a Trace gets the weighted sum of the functions that apply, or an error, reward None,
when one fails, is not finite or passes the scoring deadline (a sync function is then killed in its fork)."""

from __future__ import annotations

import asyncio
import inspect
import math
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envrl.data.traces import Error, Span
from envrl.envs.state import RolloutState
from envrl.runtime.forked import ForkedCallError, run_forked
from envrl.sandbox.errors import SandboxError

RewardFn = Callable[..., Any]
"""`fn(**asked) -> float | None` (or an awaitable of one; None: not applicable to this rollout).
It names what it needs: see ROLLOUT_ARGS."""
GroupRewardFn = Callable[..., Any]
"""`fn(**asked) -> list[float | None]`, one value per rollout of the group. See GROUP_ARGS."""

ROLLOUT_ARGS = ("task", "trace", "state", "completion", "messages", "prompt", "env")
GROUP_ARGS = ("task", "traces", "states", "completions", "envs")
"""Besides these names, any field of the task (e.g. `target`) may be asked for by name."""


class ScoringError(Exception):
    """A reward function could not be called or returned something unusable."""

    def __init__(self, message: str, error_type: str = "reward_error", traceback: str | None = None) -> None:
        super().__init__(message)
        self.error = Error(type=error_type, message=message, traceback=traceback)


@dataclass
class _Call:
    name: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(getattr(self.fn, "__call__", None))  # noqa: B004 - async __call__

    def run_sync(self) -> Any:
        try:
            return self.fn(**self.kwargs)
        except Exception as e:
            raise _raised(self.name, e) from e


def _raised(name: str, e: Exception) -> ScoringError:
    message = f"reward function {name!r} raised {type(e).__name__}: {e}"
    return ScoringError(message, traceback="".join(traceback.format_exception(e)))


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _bind(fn: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The arguments `fn` asks for, by parameter name."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(available)
    kwargs: dict[str, Any] = {}
    for p in params:
        if p.name in available:
            kwargs[p.name] = available[p.name]
        elif p.default is p.empty and p.kind is not p.VAR_POSITIONAL:
            raise ScoringError(
                f"reward function {_name(fn)!r} asks for {p.name!r}, which is not available; "
                f"it may ask for: {', '.join(sorted(available))}"
            )
    return kwargs


def _task_fields(state: RolloutState) -> dict[str, Any]:
    task = state.task
    names = [*type(task).model_fields, *(task.model_extra or {})]
    return {name: getattr(task, name) for name in names}


def _rollout_args(state: RolloutState) -> dict[str, Any]:
    return {
        **_task_fields(state),
        "task": state.task,
        "trace": state.trace,
        "state": state,
        "completion": state.completion,
        "answer": state.data.get("answer"),
        "messages": state.messages,
        "prompt": state.prompt,
        "env": state.env,
    }


def _group_args(states: list[RolloutState]) -> dict[str, Any]:
    return {
        **_task_fields(states[0]),
        "task": states[0].task,
        "traces": [s.trace for s in states],
        "states": states,
        "completions": [s.completion for s in states],
        "envs": [s.env for s in states],
    }


def _as_reward(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScoringError(f"reward function {name!r} returned {value!r}; a reward function must return a finite float")
    return float(value)


class Rubric:
    """`Rubric({fn: weight, ...}, group={group_fn: weight, ...})`; weight 0 makes a metric.

    `share_process=True` lets the sync functions of several rollouts run one after another in one
    forked child (a fork costs more than cheap scoring); only for pure functions that run no
    model-written code, since they see each other's side effects (runtime/forked.py)."""

    def __init__(
        self,
        rewards: Mapping[RewardFn, float] | None = None,
        group: Mapping[GroupRewardFn, float] | None = None,
        *,
        share_process: bool = False,
    ) -> None:
        self.rewards = dict(rewards or {})
        self.group_rewards = dict(group or {})
        self.share_process = share_process
        names = [_name(fn) for fn in [*self.rewards, *self.group_rewards]]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique (they name the metrics); got {names}")

    @property
    def group_scoring(self) -> bool:
        return bool(self.group_rewards)

    async def score(self, state: RolloutState, timeout: float | None = None) -> None:
        """Score one rollout (group functions, if any, see a group of one)."""
        await self.score_group([state], timeout)

    async def score_group(self, states: list[RolloutState], timeout: float | None = None) -> None:
        """Score the rollouts of one task together. Rollouts that already failed, and rollouts that
        never reached the model (no turn: e.g. a prompt longer than the context), are left alone:
        they stay without reward, so nothing the model did not do is rewarded or enters a baseline."""
        scorable = [s for s in states if not s.trace.has_error and s.trace.num_turns > 0]
        if not scorable:
            return
        start = time.time()
        try:
            calls = [_Call(_name(fn), fn, _bind(fn, _rollout_args(s))) for s in scorable for fn in self.rewards]
            calls += [_Call(_name(fn), fn, _bind(fn, _group_args(scorable))) for fn in self.group_rewards]
            values = await self._evaluate(calls, timeout)
            self._assign(scorable, values)
        except ScoringError as e:
            self._fail(scorable, e.error)
        except TimeoutError:
            names = ", ".join(_name(fn) for fn in [*self.rewards, *self.group_rewards])
            message = f"reward functions ({names}) did not finish within {timeout}s (timeout.scoring_s)"
            self._fail(scorable, Error(type="scoring_timeout", message=message))
        except Exception as e:  # noqa: BLE001 - scoring never raises; the failure goes into the traces
            self._fail(scorable, Error.from_exception(e))
        finally:
            span = Span(start=start, end=time.time())
            for s in scorable:
                s.trace.timing.scoring = span

    async def _evaluate(self, calls: list[_Call], timeout: float | None) -> list[Any]:
        """Each call's value, in order: async ones on the loop, sync ones in a thread or a child."""
        sync_calls = [c for c in calls if not c.is_async]
        async_calls = [c for c in calls if c.is_async]

        def run_all_sync() -> list[Any]:
            return [c.run_sync() for c in sync_calls]

        async def sync_part() -> list[Any]:
            if not sync_calls:
                return []
            if timeout is None:
                return await asyncio.to_thread(run_all_sync)
            try:
                return await run_forked(run_all_sync, timeout, shared=self.share_process)
            except ForkedCallError as e:
                raise ScoringError(str(e), traceback=e.child_traceback) from None

        async def one_async(call: _Call) -> Any:
            try:
                return await call.fn(**call.kwargs)
            except SandboxError as e:  # the sandbox failed, not the rollout: typed, never a reward
                raise ScoringError(f"reward function {call.name!r}: {e}", e.error_type) from e
            except Exception as e:
                raise _raised(call.name, e) from e

        async def async_part() -> list[Any]:
            gathered = asyncio.gather(*(one_async(c) for c in async_calls))
            return list(await (gathered if timeout is None else asyncio.wait_for(gathered, timeout)))

        sync_values, async_values = await asyncio.gather(sync_part(), async_part())
        by_call = dict(zip(map(id, sync_calls), sync_values, strict=True)) | dict(
            zip(map(id, async_calls), async_values, strict=True)
        )
        return [by_call[id(c)] for c in calls]

    def _assign(self, states: list[RolloutState], values: list[Any]) -> None:
        """Each rollout's reward from its functions' values (None: not applicable to it)."""
        per_rollout = iter(values[: len(states) * len(self.rewards)])
        applicable: list[dict[str, tuple[float, float]]] = [{} for _ in states]
        """Per rollout: function name -> (weight, value) of the functions that applied."""
        for i in range(len(states)):
            for fn, weight in self.rewards.items():
                value = next(per_rollout)
                if value is not None:
                    applicable[i][_name(fn)] = (weight, _as_reward(_name(fn), value))
        for (fn, weight), group_values in zip(
            self.group_rewards.items(), values[len(states) * len(self.rewards) :], strict=True
        ):
            name = _name(fn)
            if not isinstance(group_values, (list, tuple)) or len(group_values) != len(states):
                raise ScoringError(
                    f"group reward function {name!r} must return one value per rollout ({len(states)}); got {group_values!r}"
                )
            for i, value in enumerate(group_values):
                if value is not None:
                    applicable[i][name] = (weight, _as_reward(name, value))
        all_weight = sum(abs(w) for w in [*self.rewards.values(), *self.group_rewards.values()])
        for state, scored in zip(states, applicable, strict=True):
            weight = sum(abs(w) for w, _ in scored.values())
            if (self.rewards or self.group_rewards) and (not scored or (all_weight > 0 and weight == 0)):
                names = ", ".join(_name(fn) for fn in [*self.rewards, *self.group_rewards])
                self._fail([state], Error(type="no_reward", message=(
                    f"no weighted reward function applies to this rollout: ({names}) returned None "
                    "(not applicable) or are metrics only (weight 0)"
                )))  # fmt: skip
                continue
            state.trace.metrics.update({name: value for name, (_, value) in scored.items()})
            total = sum(w * v for w, v in scored.values())
            state.trace.reward = total * (all_weight / weight) if weight else total

    @staticmethod
    def _fail(states: list[RolloutState], error: Error) -> None:
        for s in states:
            s.trace.error = error
            s.trace.reward = None
            s.trace.stop_reason = "error"
