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
import json
import math
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import httpx
from loguru import logger
from pydantic import Field, ValidationInfo, field_validator, model_validator

from envrl.config import BaseConfig, ConfigError, ModelConfig, config_to_toml, load_config
from envrl.data.layout import eval_results_file, eval_results_root, eval_summary_file
from envrl.data.private_dir import own_output_dir
from envrl.data.traces import Trace
from envrl.envclient.config import EnvConfig, EvalScoringConfig, check_pass_at
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.eval_grid import EvalGrid, Pair, Unit, run_grids
from envrl.envclient.handles import EnvHandle
from envrl.envclient.plan import PlannedEnv, describe, plan_env
from envrl.envclient.sidecars import Sidecars
from envrl.eval.progress import EvalProgress
from envrl.model.client import ClientConfig, EvalClientConfig, SamplingParams, TrainClientConfig
from envrl.orchestrator.jsonl import append_lines, parse_trace_line, trace_line
from envrl.runtime.atomic import atomic_write_text
from envrl.runtime.lifeline import die_with_parent
from envrl.runtime.process import ChildFailed, RestartPolicy
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.telemetry.progress import LiveLines

PROBE_TIMEOUT_S = 10.0
"""Seconds the model server has to answer the probe before the eval starts."""

DEFAULT_CLIENT = EvalClientConfig(base_url="http://127.0.0.1:8000/v1", model=ModelConfig().name)
"""The chat client of an envrl inference server on its default port, serving the default model."""


class EvalInputError(Exception):
    """Input `eval` cannot work with (earlier results in the way or out of shape), as one line."""


class EvalCommandEnvConfig(EnvConfig, EvalScoringConfig):
    """`rl eval`'s `[[env]]`: an env with its server's keys and how it is scored, in one flat table;
    `EnvHandle` reads it as the env, `EvalGrid` as the scoring."""

    def scored_env(self) -> str:
        return self.resolved_name


class EvalCommandConfig(BaseConfig):
    """Config of the `eval` entry point."""

    cli_aliases: ClassVar[dict[str, str]] = {"n": "num-examples", "r": "rollouts-per-example"}

    env: list[EvalCommandEnvConfig] = Field(min_length=1)
    """Envs to evaluate: one table (`--env.id reverse-text`) or several (`[[env]]` in TOML)."""
    num_examples: int | None = Field(None, ge=1)
    """Tasks per env, 0..n-1 of its eval split (-n); when set, replaces every env's own `num_examples`."""
    rollouts_per_example: int | None = Field(None, ge=1)
    """Rollouts per task (-r); when set, replaces every env's own `rollouts_per_example`."""
    client: ClientConfig = DEFAULT_CLIENT
    """The model under evaluation (an env with a `client` of its own is evaluated on that one); a
    chat client table (`type` eval or none) changes keys of the default one."""
    sampling: SamplingParams = SamplingParams()
    max_inflight: int = Field(32, ge=1)
    """Most rollouts in flight across all envs (a group-scored task's rollouts go out together)."""
    seed: int = 0
    """Rollout (task i, rollout j) always gets the same sampling seed, derived from this one."""
    output_dir: Path = Path("outputs/eval")
    """Results go to `<output_dir>/eval/<env>.jsonl`, env server logs to `<output_dir>/logs/envs/eval/`."""
    resume: Path | None = None
    """An earlier eval's output_dir: keep its successful rollouts, re-run the rest, write results there."""
    max_error_rate: float | None = Field(None, ge=0, le=1)
    """Exit 1 when more than this share of an env's rollouts failed (None: only when all of them did)."""
    env_ready_timeout_s: float = Field(300.0, gt=0)
    """Seconds for a spawned env server to start, or an external one to answer."""
    restarts: RestartPolicy = RestartPolicy()
    """Restarts of each env server `eval` spawned (on its address, each its own budget) when it dies."""
    log: LogConfig = LogConfig()

    @field_validator("env", mode="before")
    @classmethod
    def _one_table_is_one_env(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("env")
    @classmethod
    def _unique_names(cls, envs: list[EvalCommandEnvConfig]) -> list[EvalCommandEnvConfig]:
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
    def _apply_overrides(self) -> EvalCommandConfig:
        """-n and -r into every env; env sampling keys checked; --resume is the output dir."""
        for env in self.env:
            env.sampling_args(self.sampling)
            if self.num_examples is not None:
                env.num_examples = self.num_examples
            if self.rollouts_per_example is not None:
                env.rollouts_per_example = self.rollouts_per_example
            check_pass_at(env, env.resolved_name)
        if self.resume is not None:
            self.output_dir = self.resume
        return self

    def results_file(self, env_name: str) -> Path:
        return eval_results_file(self.output_dir, env_name)


def env_plan(config: EvalCommandConfig) -> list[PlannedEnv[EvalCommandEnvConfig]]:
    """Each env of `rl eval`: its rollouts on its own `client` if it has one, else on
    `config.client` (the orchestrator's rule), at its `address` or on a server it spawns that
    admits only `eval`'s CURVE key (made by `Sidecars` in `<output_dir>/curve/`); planned by the
    code `rl` and the orchestrator use (`envclient/plan.py`); pure."""
    keys = sidecar_keys(config.output_dir)
    return [plan_env(env, "eval", config.client, config.restarts, curve=keys) for env in config.env]


def dry_run_text(config: EvalCommandConfig) -> str:
    """What `rl eval --dry-run` prints: the resolved config, then each env's server."""
    return "\n".join(
        ["# eval", config_to_toml(config).rstrip("\n"), *describe(env_plan(config), config.output_dir), ""]
    )


class Evaluation:
    """The `eval` command: every env's grid completed by the one eval runner (`run_grids`), its
    rollouts appended as they finish, each results file rewritten in grid order at the end."""

    def __init__(self, config: EvalCommandConfig, lines: LiveLines | None = None) -> None:
        self.config = config
        self.lines = lines if lines is not None else LiveLines()
        """Where progress goes (stderr by default)."""
        self.sidecars = Sidecars(config.output_dir, config.restarts, ready_timeout=config.env_ready_timeout_s)
        """The env servers `eval` spawns (envs without `address`), supervised as `rl` supervises its own."""
        self.envs = [
            EnvHandle(
                planned.env,
                split=planned.split,
                client=planned.client,
                sampling=config.sampling,
                ready_timeout=config.env_ready_timeout_s,
                sidecars=self.sidecars,
                server=planned.server,
            )
            for planned in env_plan(config)
        ]
        self.error_causes: Counter[str] = Counter()
        """Failed rollouts by their error's type and first line, over every env (filled by `finish`)."""

    async def run(self) -> dict[str, dict[str, float]]:
        """Evaluate; the summary per env (also written to `eval/summary.json`, strict JSON: a
        metric without a value, like the reward of an env whose rollouts all failed, is null)."""
        self.check_earlier_results()
        for client, fix in self.model_clients():
            await probe_model_server(client, fix)
        try:
            await asyncio.gather(*(env.start() for env in self.envs))
            grids = [self.plan(env) for env in self.envs]
            await self.run_grids(grids)
        finally:
            await asyncio.gather(*(env.shutdown() for env in self.envs), return_exceptions=True)
            await self.sidecars.close()
        summary = {grid.name: self.finish(grid) for grid in grids}
        finite = {env: {k: v if math.isfinite(v) else None for k, v in m.items()} for env, m in summary.items()}
        atomic_write_text(eval_summary_file(self.config.output_dir), json.dumps(finite, indent=1, allow_nan=False))
        return summary

    def model_clients(self) -> list[tuple[ClientConfig, str]]:
        """Each model client the envs use, once, with the key that points it elsewhere."""
        clients: list[tuple[ClientConfig, str]] = []
        for env in self.envs:
            if all(env.client_config != client for client, _ in clients):
                own = env.client_config != self.config.client
                clients.append(
                    (env.client_config, f"env {env.name!r}'s client.base_url" if own else "--client.base-url")
                )
        return clients

    def check_earlier_results(self) -> None:
        """Refuse to mix with an earlier eval's results unless resuming it."""
        config = self.config
        if config.resume is not None and not eval_results_root(config.resume).is_dir():
            raise EvalInputError(
                f"--resume {config.resume}: no earlier eval there ({eval_results_root(config.resume)} does not exist)"
            )
        if config.resume is None:
            for env in self.envs:
                if config.results_file(env.name).exists():
                    raise EvalInputError(
                        f"{config.results_file(env.name)} holds an earlier eval; complete it with --resume {config.output_dir} "
                        "or pick a new --output-dir"
                    )

    def plan(self, env: EnvHandle) -> EvalGrid:
        """The env's grid, holding an earlier eval's successes when resuming."""
        grid = EvalGrid(env, env.config, seed=self.config.seed)
        if self.config.resume is not None:
            grid.resume(*self._read_earlier(grid))
        return grid

    def _read_earlier(self, grid: EvalGrid) -> tuple[dict[Pair, Trace], Counter[Pair]]:
        """The successful rollouts of an earlier eval of the grid's env (the later line of a pair
        wins), and how often each pair ran."""
        name, n, r = grid.name, grid.n, grid.r
        path = self.config.results_file(name)
        attempts: Counter[Pair] = Counter()
        if not path.exists():
            logger.info(f"env {name!r}: no earlier results in {path}; running all {n * r} rollouts")
            return {}, attempts
        latest: dict[Pair, Trace] = {}
        unreadable = 0
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            try:
                fields, trace = parse_trace_line(line)
                pair = (trace.task.idx, fields["rollout"])
                if fields.get("env") != name or not isinstance(pair[1], int):
                    raise ValueError(
                        f"not a rollout line of env {name!r} (env {fields.get('env')!r}, rollout {pair[1]!r})"
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
            attempts[pair] += 1
        kept = {pair: trace for pair, trace in latest.items() if not trace.has_error}
        errored = len(latest) - len(kept)
        logger.info(
            f"env {name!r}: kept {len(kept)} of {n * r} rollouts from {path}; re-running {errored} errored "
            f"and {n * r - len(latest)} missing" + (f" ({unreadable} unreadable lines)" if unreadable else "")
        )
        return kept, attempts

    async def run_grids(self, grids: list[EvalGrid]) -> None:
        """Run the grids' missing pairs, appending each finished call's rollouts to its env's file."""
        totals = {grid.name: sum(len(u.rollouts) for u in grid.units()) for grid in grids}
        progress = EvalProgress(totals, self.lines)

        def done(unit: Unit, traces: list[Trace]) -> None:
            lines = [trace_line(t, env=unit.grid.name, rollout=j) for j, t in zip(unit.rollouts, traces, strict=True)]
            append_lines(self.config.results_file(unit.grid.name), lines)
            progress.add(unit.grid.name, traces)

        try:
            await run_grids(grids, self.config.max_inflight, done)
        finally:
            self.lines.close()

    def finish(self, grid: EvalGrid) -> dict[str, float]:
        """Rewrite the env's results file in grid order (atomically), count its errors by cause,
        and summarise it."""
        for trace in (t for group in grid.groups() for t in group):
            if trace.error is not None:
                self.error_causes[f"{trace.error.type}: {trace.error.message.splitlines()[0][:160]}"] += 1
        lines = [trace_line(t, env=grid.name, rollout=j) for group in grid.groups() for j, t in enumerate(group)]
        atomic_write_text(self.config.results_file(grid.name), "".join(lines))
        return grid.summary()


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


async def probe_model_server(client: ClientConfig, fix: str) -> None:
    """EvalInputError, at once, if the model server of `client` does not answer at all (nothing
    listens, a wrong host), saying to correct `fix`: without it every rollout would fail the same
    way, slowly."""
    if isinstance(client, EvalClientConfig):
        urls = [f"{client.base_url.rstrip('/')}/models"]
    elif isinstance(client, TrainClientConfig):
        urls = [f"{url.rstrip('/')}/v1/models" for url in client.base_urls]
    else:
        return
    own = isinstance(client, TrainClientConfig)  # envrl's own servers: never through a proxy
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=not own) as http:
        for url in urls:
            try:
                await http.get(url)
            except httpx.HTTPError as e:
                raise EvalInputError(
                    f"no model server answers at {url} ({type(e).__name__}: {e or 'no answer'}): start one "
                    f"(`uv run --no-sync inference --model.name ...`) or point {fix} at it"
                ) from None


def failure(summary: dict[str, dict[str, float]], max_error_rate: float | None) -> str | None:
    """Why this eval failed (None: it did not): an env whose rollouts all failed, or more of them
    than `max_error_rate`."""
    for env, metrics in summary.items():
        rate = metrics["error_rate"]
        if (max_error_rate is None and rate >= 1.0) or (max_error_rate is not None and rate > max_error_rate):
            limit = "every rollout" if max_error_rate is None else f"more than --max-error-rate {max_error_rate:g}"
            return f"env {env}: {rate:.0%} of its rollouts failed ({limit})"
    return None


async def _run(config: EvalCommandConfig, lines: LiveLines) -> tuple[dict[str, dict[str, float]], Counter[str]]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    evaluation = Evaluation(config, lines)
    return await evaluation.run(), evaluation.error_causes


def main(argv: list[str] | None = None) -> None:
    config = load_config(EvalCommandConfig, argv, prog="rl eval", dry_run=dry_run_text)
    try:
        own_output_dir(config.output_dir)  # made 0700 (before its logs): what the model wrote is nobody else's
    except ConfigError as e:
        print(f"rl eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    lines = LiveLines()
    lines.use_for_stderr()
    setup_logging(config.log, process="eval")
    die_with_parent()
    try:
        summary, causes = asyncio.run(_run(config, lines))
    except EvalInputError as e:
        print(f"rl eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ChildFailed as e:
        logger.error(f"eval failed: {e}")
        sys.exit(1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        logger.warning(
            f"eval stopped by a signal; finished rollouts are in {eval_results_root(config.output_dir)}: add --resume {config.output_dir}"
        )
        sys.exit(130)
    except Exception as e:
        logger.opt(exception=e).error(f"eval failed: {e}")
        sys.exit(1)
    print(format_summary(summary))
    if causes:
        top = "; ".join(f"{n}x {cause}" for cause, n in causes.most_common(3))
        logger.warning(f"{causes.total()} rollouts failed; most common causes: {top}")
    why = failure(summary, config.max_error_rate)
    if why is not None:
        logger.error(f"eval failed: {why}; results in {eval_results_root(config.output_dir)}")
        sys.exit(1)
    logger.success(f"results in {eval_results_root(config.output_dir)} (summary.json and one <env>.jsonl per env)")


if __name__ == "__main__":
    main()
