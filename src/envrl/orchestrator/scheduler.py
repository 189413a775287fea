"""Every group dispatched leaves exactly once (in a batch, as stale, or at `close()`), dispatched only within
`max_inflight` and for a step it can still train; seeds from `train_group_seed`; infra failures refilled within
`refill_rollouts`."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from envrl.data.seeds import train_group_seed
from envrl.data.traces import Error, Trace, WireTask
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.orchestrator.state import PendingGroup
from envrl.orchestrator.trajectories import oldest_policy_step
from envrl.telemetry.ledger import Ledger

if TYPE_CHECKING:
    from envrl.orchestrator.config import OrchestratorConfig


@dataclass
class Group:
    """One task's `group_size` rollouts, dispatched under policy `policy_step` (traces once done)."""

    env: EnvHandle
    task_idx: int
    seed: int
    policy_step: int
    traces: list[Trace]
    dispatched: float = field(default_factory=time.time)
    """When it was dispatched (wall clock, as the ledger and Trace.timing)."""
    oldest_step: int | None = None
    """With partial rollouts, once done: the oldest policy step of any of its tokens."""
    replaced: list[Trace] = field(default_factory=list)
    """Failed attempts (infra errors) that a refill replaced in `traces`: recorded, never trained."""
    refilling: list[int] = field(default_factory=list)
    """Indices of `traces` being run again (a refill in flight); empty otherwise."""
    refills: int = 0
    """Refill rounds so far (each samples with fresh seeds)."""

    @property
    def all_traces(self) -> list[Trace]:
        """Every rollout the group ran: its traces, then the failed attempts refills replaced."""
        return [*self.traces, *self.replaced]

    @property
    def counted_step(self) -> int:
        """The policy the off-policy bound counts the group as (see the module docstring)."""
        return self.policy_step if self.oldest_step is None else self.oldest_step


@dataclass(frozen=True)
class BatchShape:
    """The numbers scheduling depends on (the orchestrator config's keys of the same names)."""

    group_size: int
    batch_size: int
    max_inflight: int
    max_async_level: int
    max_steps: int

    @classmethod
    def of(cls, config: OrchestratorConfig) -> BatchShape:
        return cls(
            group_size=config.group_size, batch_size=config.batch_size, max_inflight=config.inflight_limit,
            max_async_level=config.max_async_level, max_steps=config.max_steps,
        )  # fmt: skip

    @property
    def groups_per_step(self) -> int:
        return self.batch_size // self.group_size


class Scheduler:
    """Keeps train groups in flight within the async bound and hands out whole batches."""

    def __init__(
        self,
        envs: TrainEnvs,
        shape: BatchShape,
        *,
        seed: int,
        counters: Counter[str],
        dispatched: int = 0,
        requeued: Sequence[PendingGroup] = (),
        ledger: Ledger | None = None,
        partial_rollouts: bool = False,
        refill_rollouts: int = 0,
    ) -> None:
        self.envs = envs
        self.refill_rollouts = refill_rollouts
        """Rollouts that may be run again after an infra failure, per `collect` call (per step)."""
        self._refill_left = 0
        self.partial_rollouts = partial_rollouts
        """Generations go on across weight reloads: staleness counts each group's oldest token."""
        self.shape = shape
        self.seed = seed
        self.counters = counters
        """Shared `counters/...` metrics: dispatched, requeued rollouts, stale groups."""
        self.dispatched = dispatched
        """New groups drawn so far (seeds and env picks derive from it; saved with each batch)."""
        self._requeued = list(requeued)
        self._inflight: dict[asyncio.Task[list[Trace]], Group] = {}
        self._ready: list[Group] = []
        self._stale: list[Group] = []
        """Groups that arrived (partial rollouts) already too old for the step collecting them."""
        self.ledger = ledger or Ledger(None, "orchestrator")
        """Where `collect` records dispatching and each batched rollout's phases."""

    @property
    def inflight_rollouts(self) -> int:
        return sum(len(g.refilling) or self.shape.group_size for g in self._inflight.values())

    def inflight_groups(self) -> list[Group]:
        """The groups in flight, oldest first."""
        return list(self._inflight.values())

    def pending(self) -> list[PendingGroup]:
        """Groups dispatched or requeued but not yet in a batch: what a resume dispatches again."""
        groups = [*self._inflight.values(), *self._ready]
        held = [PendingGroup(env=g.env.name, task_idx=g.task_idx, seed=g.seed) for g in groups]
        return [*held, *self._requeued]

    def dispatch(self, step: int, policy: int) -> None:
        """Start groups while there is room in flight and they would not be stale on arrival."""
        shape = self.shape
        while self.inflight_rollouts + shape.group_size <= shape.max_inflight:
            target = step + (len(self._ready) + len(self._inflight)) // shape.groups_per_step
            if target >= shape.max_steps or policy < target - shape.max_async_level:
                return
            env, task_idx, seed = self._next_group()
            self.counters["dispatched_rollouts"] += shape.group_size
            task = asyncio.create_task(env.run_group(task_idx, shape.group_size, seed))
            self._inflight[task] = Group(env, task_idx, seed, policy, [])

    def _next_group(self) -> tuple[EnvHandle, int, int]:
        """A requeued group (its first dispatch died with the crashed run), else a new draw."""
        if self._requeued:
            redo = self._requeued.pop(0)
            self.counters["requeued_rollouts"] += self.shape.group_size
            return self.envs.by_name(redo.env), redo.task_idx, redo.seed
        env = self.envs.pick(random.Random(f"{self.seed}/pick/{self.dispatched}"))
        seed = train_group_seed(self.seed, self.dispatched, self.shape.group_size)
        self.dispatched += 1
        return env, self.envs.next_task(env), seed

    async def collect(self, step: int, policy: int) -> list[Group]:
        """The next batch's groups (finished first, first), dispatching as room frees up."""
        per_step = self.shape.groups_per_step
        self._refill_left = self.refill_rollouts
        while len(self._ready) < per_step:
            with self.ledger.span("dispatch", step):
                self.dispatch(step, policy)
            done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = self._inflight.pop(task)
                group.traces, group.refilling = task.result(), []
                if self._refill(group):
                    continue
                if self.partial_rollouts:
                    group.oldest_step = oldest_policy_step(group.traces, group.policy_step)
                if group.counted_step < step - self.shape.max_async_level:
                    self._stale.append(group)
                else:
                    self._ready.append(group)
        batch, self._ready = self._ready[:per_step], self._ready[per_step:]
        for group in batch:
            self._record_rollouts(group, step)
        return batch

    def _refill(self, group: Group) -> bool:
        """Run the group's infra-failed rollouts again, as many as the step's refill budget allows
        (the group stays in flight); False when there is nothing to refill or no budget left."""
        failed = [i for i, t in enumerate(group.traces) if t.outcome == "infra_error"]
        if not failed or group.env.group_scoring or self._refill_left <= 0:
            return False
        group.refilling = failed[: self._refill_left]
        self._refill_left -= len(group.refilling)
        group.refills += 1
        self._inflight[asyncio.create_task(self._rerun(group))] = group
        return True

    async def _rerun(self, group: Group) -> list[Trace]:
        """The group's traces with those at `group.refilling` run again, one rollout each. Rollout i
        keeps its seed family (`seed + i`) and samples past every attempt made before (a refill
        round starts past the env's `max_retries` re-runs of the previous round)."""
        env, attempt = group.env, group.refills * (group.env.config.max_retries + 1)
        runs = [env.run_group(group.task_idx, 1, group.seed + i, attempt=attempt) for i in group.refilling]
        traces = list(group.traces)
        for i, (trace,) in zip(group.refilling, await asyncio.gather(*runs), strict=True):
            group.replaced.append(traces[i])
            traces[i] = trace
        return traces

    def _record_rollouts(self, group: Group, step: int) -> None:
        """Each rollout's phases as its env worker timed them (`Trace.timing`), seen from here with
        no extra IPC: `env_queue` from dispatch to the worker's start (transport and retries
        included), then setup, generation (on the `inference` track) and scoring; the `rollout`
        span carries its seconds per tool name (`tools`). Every span names its env."""
        track = f"env {group.env.name}"
        for i, trace in enumerate(group.traces):
            phases = [
                (name, span) for name in ("setup", "generation", "scoring") if (span := getattr(trace.timing, name))
            ]
            if not phases:
                continue
            ids = {"env": group.env.name, "rollout": i, "task": group.task_idx, "seed": group.seed}
            tools = {"tools": trace.timing.tools} if trace.timing.tools else {}
            self.ledger.record("rollout", step, group.dispatched, phases[-1][1].end, process=track, **ids, **tools)
            self.ledger.record("env_queue", step, group.dispatched, phases[0][1].start, process=track, **ids)
            for name, span in phases:
                where = "inference" if name == "generation" else track
                self.ledger.record(name, step, span.start, span.end, process=where, **ids)

    def drop_stale(self, step: int) -> list[Group]:
        """Drop finished groups that `step` may no longer train on (and those that arrived too old
        while `collect` gathered a batch: call it again after `collect(step)`, or the last step's
        are never handed back), and cancel in-flight ones that cannot become trainable (never with
        partial rollouts); the dropped groups come back with every trace marked with a `stale`
        error, for the record."""
        oldest = step - self.shape.max_async_level
        stale, self._stale = self._stale, []
        stale += [g for g in self._ready if g.counted_step < oldest]
        self._ready = [g for g in self._ready if g.counted_step >= oldest]
        for task, group in list(self._inflight.items()):
            if group.policy_step < oldest and not self.partial_rollouts:
                task.cancel()
                del self._inflight[task]
                stale.append(group)
        for group in stale:
            error = Error(
                type="stale", message=f"generated by policy {group.counted_step}; step {step} needs >= {oldest}"
            )
            if not group.traces:
                group.traces = [
                    Trace.from_error(WireTask(idx=group.task_idx), error) for _ in range(self.shape.group_size)
                ]
            for trace in group.traces:
                trace.error = error
        if stale:
            self.counters["stale_groups"] += len(stale)
        return stale

    async def close(self) -> None:
        """Cancel every group in flight and wait for the cancellations."""
        tasks = list(self._inflight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
