"""The one eval runner: a grid of (task, rollout) pairs, each with `eval_seed(seed, i, j, r)`, so an eval reproduces
from its seed in any process; never more than `max_inflight` rollouts in flight, complete once it returns."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from envrl.data.seeds import eval_seed
from envrl.data.traces import Trace
from envrl.envclient.config import EvalScoringConfig
from envrl.envclient.handles import EnvHandle
from envrl.telemetry.rollouts import pass_at_k, rollout_metrics

Pair = tuple[int, int]
"""(task index, rollout index) within one env's grid."""


@dataclass
class Unit:
    """Rollouts dispatched as one `run_group` call: one rollout, or a group-scored task's all."""

    grid: EvalGrid
    task_idx: int
    rollouts: list[int]


class EvalGrid:
    """One env's n x r grid (`scoring`): the pairs done so far, the calls that complete it, each pair's seed."""

    def __init__(self, env: EnvHandle, scoring: EvalScoringConfig, *, seed: int) -> None:
        self.env = env
        self.scoring = scoring
        self.seed = seed
        self.n, self.r = scoring.num_examples, scoring.rollouts_per_example
        if self.n > env.num_tasks:
            logger.warning(
                f"env {env.name!r} has {env.num_tasks} eval tasks; evaluating all of them instead of {self.n}"
            )
            self.n = env.num_tasks
        self.records: dict[Pair, Trace] = {}
        self.attempts: Counter[Pair] = Counter()
        """How often each pair ran before (lines of an earlier eval): a re-run draws a fresh seed."""

    @property
    def name(self) -> str:
        return self.env.name

    def pairs(self) -> list[Pair]:
        return [(i, j) for i in range(self.n) for j in range(self.r)]

    def resume(self, kept: dict[Pair, Trace], attempts: Counter[Pair]) -> None:
        """Keep earlier successful rollouts; `attempts` counts every earlier run of each pair."""
        self.records = dict(kept)
        self.attempts = Counter(attempts)

    def units(self) -> list[Unit]:
        """The calls that run the missing pairs: one per pair, or whole tasks if group-scored."""
        missing = [(i, j) for i, j in self.pairs() if (i, j) not in self.records]
        if self.env.group_scoring:
            return [Unit(self, i, list(range(self.r))) for i in sorted({i for i, _ in missing})]
        return [Unit(self, i, [j]) for i, j in missing]

    def seed_of(self, unit: Unit) -> tuple[int, int]:
        """The first rollout's seed and the attempt to start at: each earlier run of a pair spent
        attempts 0..max_retries, so a re-run starts past all of them."""
        runs = max(self.attempts.get((unit.task_idx, j), 0) for j in unit.rollouts)
        return eval_seed(self.seed, unit.task_idx, unit.rollouts[0], self.r), runs * (self.env.config.max_retries + 1)

    def record(self, unit: Unit, traces: list[Trace]) -> None:
        for rollout, trace in zip(unit.rollouts, traces, strict=True):
            self.records[(unit.task_idx, rollout)] = trace

    def groups(self) -> list[list[Trace]]:
        """Every task's traces, in grid order (the grid must be complete)."""
        return [[self.records[(i, j)] for j in range(self.r)] for i in range(self.n)]

    def summary(self) -> dict[str, float]:
        """The grid's shape, rollout metrics and pass@k, keyed without the env's name."""
        groups = self.groups()
        traces = [t for group in groups for t in group]
        metrics = {k.removeprefix(f"{self.name}/"): v for k, v in rollout_metrics(self.name, traces).items()}
        passes = pass_at_k(groups, self.scoring.pass_threshold, self.scoring.pass_at)
        return {**metrics, "tasks": float(self.n), "rollouts_per_example": float(self.r), **passes}


async def run_grids(
    grids: list[EvalGrid], max_inflight: int, on_done: Callable[[Unit, list[Trace]], None] | None = None
) -> None:
    """Run every grid's missing pairs, the envs' calls interleaved, with at most `max_inflight`
    rollouts in flight; each finished call is recorded in its grid, then given to `on_done`.
    Cancelling this cancels what is in flight."""
    plans = [grid.units() for grid in grids]
    pending = [u for u in itertools.chain.from_iterable(itertools.zip_longest(*plans)) if u is not None]
    pending.reverse()
    inflight: dict[asyncio.Task[list[Trace]], Unit] = {}
    try:
        while pending or inflight:
            used = sum(len(u.rollouts) for u in inflight.values())
            while pending and (not inflight or used + len(pending[-1].rollouts) <= max_inflight):
                unit = pending.pop()
                seed, attempt = unit.grid.seed_of(unit)
                call = unit.grid.env.run_group(unit.task_idx, len(unit.rollouts), seed, attempt)
                inflight[asyncio.create_task(call)] = unit
                used += len(unit.rollouts)
            done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                unit = inflight.pop(task)
                unit.grid.record(unit, task.result())
                if on_done is not None:
                    on_done(unit, task.result())
    finally:
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
