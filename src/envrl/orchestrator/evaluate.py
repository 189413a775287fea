"""`eval`: evaluate a served model on one or more envs, without training.

Guarantee: when `eval` finishes, `<output_dir>/eval/<env>.jsonl` holds exactly one line per
(task, rollout) pair of that env's grid (tasks 0..n-1 of its eval split, r rollouts each), in
grid order, and the summary (printed, and `eval/summary.json`) is computed from exactly those
lines. While it runs, each finished rollout is appended at once, so a crash or Ctrl-C loses only
what was in flight; `--resume DIR` keeps the successful rollouts found there (for a pair written
twice, the later line wins), re-runs the missing and errored pairs (whole tasks for group-scored
envs, whose rewards only mean something together), and rewrites each file atomically.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger
from pydantic import Field, ValidationInfo, field_validator, model_validator

from envrl.atomic import atomic_write_text
from envrl.config import BaseConfig, ModelConfig, load_config
from envrl.envs.model_client import ClientConfig, EvalClientConfig
from envrl.log import LogConfig, setup_logging
from envrl.orchestrator.config import EvalEnvConfig, SamplingConfig, check_pass_at
from envrl.orchestrator.envs import Env
from envrl.orchestrator.jsonl import append_lines, parse_trace_line, trace_line
from envrl.orchestrator.seeds import rollout_seed
from envrl.orchestrator.stats import pass_at_k, rollout_metrics
from envrl.process import ChildFailed, die_with_parent
from envrl.traces import Trace

PROGRESS_INTERVAL = 5.0
"""Seconds between progress lines (the first and the last rollout always log one)."""

DEFAULT_CLIENT = EvalClientConfig(base_url="http://127.0.0.1:8000/v1", model=ModelConfig().name)
"""The chat client of an envrl inference server on its default port, serving the default model."""

Pair = tuple[int, int]
"""(task index, rollout index) within one env's grid."""


class EvalInputError(Exception):
    """Input `eval` cannot work with (earlier results in the way or out of shape), as one line."""


class EvalConfig(BaseConfig):
    """Config of the `eval` entry point."""

    cli_aliases: ClassVar[dict[str, str]] = {"n": "num-examples", "r": "rollouts-per-example"}

    env: list[EvalEnvConfig] = Field(min_length=1)
    """Envs to evaluate: one table (`--env.id reverse-text`) or several (`[[env]]` in TOML)."""
    num_examples: int | None = Field(None, ge=1)
    """Tasks per env, 0..n-1 of its eval split (-n); when set, replaces every env's own `num_examples`."""
    rollouts_per_example: int | None = Field(None, ge=1)
    """Rollouts per task (-r); when set, replaces every env's own `rollouts_per_example`."""
    client: ClientConfig = DEFAULT_CLIENT
    """The model under evaluation; a chat client table (`type` eval or none) changes keys of the default one."""
    sampling: SamplingConfig = SamplingConfig()
    max_inflight: int = Field(32, ge=1)
    """Most rollouts in flight across all envs (a group-scored task's rollouts go out together)."""
    seed: int = 0
    """Rollout (task i, rollout j) always gets the same sampling seed, derived from this one."""
    output_dir: Path = Path("outputs/eval")
    """Results go to `<output_dir>/eval/<env>.jsonl`, env server logs to `<output_dir>/logs/envs/eval/`."""
    resume: Path | None = None
    """An earlier eval's output_dir: keep its successful rollouts, re-run the rest, write results there."""
    env_ready_timeout: float = Field(300.0, gt=0)
    """Seconds for a spawned env server to start, or an external one to answer."""
    log: LogConfig = LogConfig()

    @field_validator("env", mode="before")
    @classmethod
    def _one_table_is_one_env(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("env")
    @classmethod
    def _unique_names(cls, envs: list[EvalEnvConfig]) -> list[EvalEnvConfig]:
        names = [env.resolved_name for env in envs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"env names must be unique; {duplicates} used twice (set `name`)")
        return envs

    @field_validator("client", mode="before")
    @classmethod
    def _chat_client_by_default(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type", "eval") == "eval":
            return {**DEFAULT_CLIENT.model_dump(), **value}
        return value

    @field_validator("resume")
    @classmethod
    def _resume_writes_in_place(cls, resume: Path | None, info: ValidationInfo) -> Path | None:
        output_dir = info.data.get("output_dir")
        if resume is not None and output_dir not in (resume, cls.model_fields["output_dir"].default):
            raise ValueError(f"resuming writes the results back into {resume}; drop --output-dir {output_dir}")
        return resume

    @model_validator(mode="after")
    def _apply_overrides(self) -> EvalConfig:
        """-n and -r into every env; env sampling keys checked; --resume is the output dir."""
        for env in self.env:
            env.sampling_args(self.sampling)
            if self.num_examples is not None:
                env.num_examples = self.num_examples
            if self.rollouts_per_example is not None:
                env.rollouts_per_example = self.rollouts_per_example
            check_pass_at(env)
        if self.resume is not None:
            self.output_dir = self.resume
        return self

    def results_file(self, env_name: str) -> Path:
        return self.output_dir / "eval" / f"{env_name}.jsonl"


@dataclass
class Unit:
    """Rollouts dispatched as one `run_group` call: one rollout, or a group-scored task's all."""

    env: Env
    task_idx: int
    rollouts: list[int]


def grid_units(env: Env, pairs: list[Pair], r: int) -> list[Unit]:
    """The calls that run `pairs` of `env`'s grid: one per pair, or whole tasks if group-scored."""
    if env.group_scoring:
        return [Unit(env, i, list(range(r))) for i in sorted({i for i, _ in pairs})]
    return [Unit(env, i, [j]) for i, j in pairs]


async def run_units(
    units: list[Unit],
    max_inflight: int,
    seed: Callable[[Unit], tuple[int, int]],
    on_done: Callable[[Unit, list[Trace]], None],
) -> None:
    """Run `units` in order with at most `max_inflight` rollouts in flight (a unit bigger than that
    runs alone); `seed(unit)` gives its first rollout's seed and attempt number, `on_done` gets
    each unit's traces as it finishes. Cancelling this cancels what is in flight."""
    pending = list(reversed(units))
    inflight: dict[asyncio.Task[list[Trace]], Unit] = {}
    try:
        while pending or inflight:
            used = sum(len(u.rollouts) for u in inflight.values())
            while pending and (not inflight or used + len(pending[-1].rollouts) <= max_inflight):
                unit = pending.pop()
                first_seed, attempt = seed(unit)
                call = unit.env.run_group(unit.task_idx, len(unit.rollouts), first_seed, attempt)
                inflight[asyncio.create_task(call)] = unit
                used += len(unit.rollouts)
            done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                on_done(inflight.pop(task), task.result())
    finally:
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)


class Progress:
    """Done/total, errors and rate, logged at most every PROGRESS_INTERVAL seconds."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.errors = total, 0, 0
        self.started = self.last_log = time.monotonic()

    def add(self, traces: list[Trace]) -> None:
        self.done += len(traces)
        self.errors += sum(t.has_error for t in traces)
        now = time.monotonic()
        if now - self.last_log >= PROGRESS_INTERVAL or self.done == self.total or self.done == len(traces):
            self.last_log = now
            rate = self.done / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else 0.0
            logger.info(
                f"rollouts {self.done}/{self.total} ({self.done / self.total:.0%}) | {rate:.2f} rollouts/s | "
                f"errors {self.errors} | eta {eta:.0f} s"
            )


class Evaluation:
    """Runs every env's missing grid pairs within `max_inflight` and keeps the results in order."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self.envs = [
            Env(
                env,
                split="eval",
                client=config.client,
                sampling=config.sampling,
                log_dir=config.output_dir / "logs" / "envs" / "eval",
                ready_timeout=config.env_ready_timeout,
            )
            for env in config.env
        ]
        self.records: dict[str, dict[Pair, Trace]] = {env.name: {} for env in self.envs}
        self.attempts: dict[str, Counter[Pair]] = {}
        """Per env, how often each pair was run before (lines in an earlier eval): a re-run draws a fresh seed."""
        self.grids: dict[str, Pair] = {}

    async def run(self) -> dict[str, dict[str, float]]:
        """Evaluate; the summary per env (also written to `eval/summary.json`)."""
        self._check_earlier_results()
        try:
            await asyncio.gather(*(env.start() for env in self.envs))
            plans = [self._plan(env) for env in self.envs]
            units = [u for u in itertools.chain.from_iterable(itertools.zip_longest(*plans)) if u is not None]
            await self._run_units(units)
        finally:
            await asyncio.gather(*(env.shutdown() for env in self.envs), return_exceptions=True)
        summary = {env.name: self._finish(env) for env in self.envs}
        atomic_write_text(self.config.output_dir / "eval" / "summary.json", json.dumps(summary, indent=1))
        return summary

    def _check_earlier_results(self) -> None:
        config = self.config
        if config.resume is not None and not (config.resume / "eval").is_dir():
            raise EvalInputError(
                f"--resume {config.resume}: no earlier eval there ({config.resume / 'eval'} does not exist)"
            )
        if config.resume is None:
            for env in self.envs:
                if config.results_file(env.name).exists():
                    raise EvalInputError(
                        f"{config.results_file(env.name)} holds an earlier eval; complete it with --resume {config.output_dir} "
                        "or pick a new --output-dir"
                    )

    def _plan(self, env: Env) -> list[Unit]:
        """The units that make this env's grid complete, after keeping earlier successes."""
        config = env.config
        assert isinstance(config, EvalEnvConfig)
        n, r = config.num_examples, config.rollouts_per_example
        if n > env.num_tasks:
            logger.warning(f"env {env.name!r} has {env.num_tasks} eval tasks; evaluating all of them instead of {n}")
            n = env.num_tasks
        self.grids[env.name] = (n, r)
        self.attempts[env.name] = Counter()
        kept = self._read_earlier(env, n, r) if self.config.resume is not None else {}
        self.records[env.name] = kept
        return grid_units(env, [(i, j) for i in range(n) for j in range(r) if (i, j) not in kept], r)

    def _read_earlier(self, env: Env, n: int, r: int) -> dict[Pair, Trace]:
        """The successful rollouts of an earlier eval of `env` (the later line of a pair wins)."""
        path = self.config.results_file(env.name)
        if not path.exists():
            logger.info(f"env {env.name!r}: no earlier results in {path}; running all {n * r} rollouts")
            return {}
        latest: dict[Pair, Trace] = {}
        unreadable = 0
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            try:
                fields, trace = parse_trace_line(line)
                pair = (trace.task.idx, fields["rollout"])
                if fields.get("env") != env.name or not isinstance(pair[1], int):
                    raise ValueError(
                        f"not a rollout line of env {env.name!r} (env {fields.get('env')!r}, rollout {pair[1]!r})"
                    )
            except (ValueError, KeyError) as e:
                unreadable += 1
                logger.warning(f"{path}:{lineno}: skipped, its rollout will be re-run: {e}")
                continue
            if not (0 <= pair[0] < n and 0 <= pair[1] < r):
                raise EvalInputError(
                    f"{path}:{lineno} is task {pair[0]} rollout {pair[1]}, outside this eval's {n} tasks x {r} rollouts; "
                    "resume with the earlier eval's -n and -r"
                )
            latest[pair] = trace
            self.attempts[env.name][pair] += 1
        kept = {pair: trace for pair, trace in latest.items() if not trace.has_error}
        errored = len(latest) - len(kept)
        logger.info(
            f"env {env.name!r}: kept {len(kept)} of {n * r} rollouts from {path}; re-running {errored} errored "
            f"and {n * r - len(latest)} missing" + (f" ({unreadable} unreadable lines)" if unreadable else "")
        )
        return kept

    async def _run_units(self, units: list[Unit]) -> None:
        progress = Progress(sum(len(u.rollouts) for u in units))

        def seed(unit: Unit) -> tuple[int, int]:
            # Each earlier line spent attempts 0..max_retries of its run: start past all of them.
            runs = max(self.attempts[unit.env.name].get((unit.task_idx, j), 0) for j in unit.rollouts)
            return self._seed(unit.env, unit.task_idx, unit.rollouts[0]), runs * (unit.env.config.max_retries + 1)

        def done(unit: Unit, traces: list[Trace]) -> None:
            self._record(unit, traces)
            progress.add(traces)

        await run_units(units, self.config.max_inflight, seed, done)

    def _seed(self, env: Env, task_idx: int, rollout: int) -> int:
        """Seed of rollout `rollout` of task `task_idx`; a group's rollouts take consecutive seeds."""
        return rollout_seed(self.config.seed, task_idx * self.grids[env.name][1] + rollout)

    def _record(self, unit: Unit, traces: list[Trace]) -> None:
        name = unit.env.name
        lines = []
        for rollout, trace in zip(unit.rollouts, traces, strict=True):
            self.records[name][(unit.task_idx, rollout)] = trace
            lines.append(trace_line(trace, env=name, rollout=rollout))
        append_lines(self.config.results_file(name), lines)

    def _finish(self, env: Env) -> dict[str, float]:
        """Rewrite the env's results file in grid order (atomically) and summarise it."""
        config = env.config
        assert isinstance(config, EvalEnvConfig)
        n, r = self.grids[env.name]
        records = self.records[env.name]
        groups = [[records[(i, j)] for j in range(r)] for i in range(n)]
        lines = [trace_line(trace, env=env.name, rollout=j) for group in groups for j, trace in enumerate(group)]
        atomic_write_text(self.config.results_file(env.name), "".join(lines))
        traces = [t for group in groups for t in group]
        metrics = {key.removeprefix(f"{env.name}/"): value for key, value in rollout_metrics(env.name, traces).items()}
        passes = pass_at_k(groups, config.pass_threshold, config.pass_at)
        return {**metrics, "tasks": float(n), "rollouts_per_example": float(r), **passes}


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    """One row per env: its grid, mean reward, error rate, pass@1, pass@r and mean tokens per rollout.

    Token columns show `-` when no rollout carried tokens (a chat client without `return_tokens`).
    """
    header = ["env", "tasks", "r", "reward", "errors", "pass@1", "pass@r", "completion tokens", "total tokens"]
    rows = []
    for name, m in summary.items():
        r = int(m["rollouts_per_example"])
        tokens = [f"{m[key]:.1f}" if m[key] else "-" for key in ("completion_len", "total_tokens")]
        rows.append(
            [
                name,
                f"{m['tasks']:.0f}",
                str(r),
                f"{m['reward']:.3f}",
                f"{m['error_rate']:.1%}",
                f"{m['pass@1']:.3f}",
                f"{m[f'pass@{r}']:.3f}",
                *tokens,
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    )


async def _run(config: EvalConfig) -> dict[str, dict[str, float]]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await Evaluation(config).run()


def main(argv: list[str] | None = None) -> None:
    config = load_config(EvalConfig, argv, prog="eval")
    setup_logging(config.log, process="eval")
    die_with_parent()
    try:
        summary = asyncio.run(_run(config))
    except EvalInputError as e:
        print(f"eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ChildFailed as e:
        logger.error(f"eval failed: {e}")
        sys.exit(1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        logger.warning(
            f"eval stopped by a signal; finished rollouts are in {config.output_dir / 'eval'}: add --resume {config.output_dir}"
        )
        sys.exit(130)
    except Exception as e:
        logger.opt(exception=e).error(f"eval failed: {e}")
        sys.exit(1)
    logger.success(f"results in {config.output_dir / 'eval'} (summary.json and one <env>.jsonl per env)")
    print(format_summary(summary))


if __name__ == "__main__":
    main()
