"""`eval`'s runner: when it finishes, `<output_dir>/eval/<env>.jsonl` holds one line per (task, rollout) pair in
grid order and the summary is computed from exactly those lines; a crash loses only what was in flight (`--resume
DIR`)."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from envrl.data.rollout_lines import append_lines, trace_line
from envrl.data.traces import Trace
from envrl.envclient.eval_grid import EvalGrid, Unit, run_grids
from envrl.envclient.handles import EnvHandle
from envrl.envclient.sidecars import Sidecars
from envrl.eval.config import EvalCommandConfig, EvalInputError, eval_envs
from envrl.eval.progress import EvalProgress
from envrl.eval.resume import check_earlier_results, read_earlier
from envrl.eval.summary import write_summary
from envrl.model.client import ClientConfig, EvalClientConfig, TrainClientConfig
from envrl.runtime.atomic import atomic_write_text
from envrl.telemetry.progress import LiveLines

PROBE_TIMEOUT_S = 10.0
"""Seconds the model server has to answer the probe before the eval starts."""


class Evaluation:
    """The `eval` command: every env's grid completed by the one eval runner (`run_grids`), its
    rollouts appended as they finish, each results file rewritten in grid order at the end."""

    def __init__(self, config: EvalCommandConfig, lines: LiveLines | None = None) -> None:
        self.config = config
        self.lines = lines if lines is not None else LiveLines()
        """Where progress goes (stderr by default)."""
        self.sidecars = Sidecars(config.output_dir, config.restarts, ready_timeout=config.env_ready_timeout_s)
        """The env servers `eval` spawns (envs without `address`), supervised as `rl` supervises its own."""
        self.envs = [EnvHandle.of(planned, self.sidecars, config.sampling) for planned in eval_envs(config)]
        self.error_causes: Counter[str] = Counter()
        """Failed rollouts by their error's type and first line, over every env (filled by `finish`)."""

    async def run(self) -> dict[str, dict[str, float]]:
        """Evaluate; the summary per env (also written to `eval/summary.json`, strict JSON: a
        metric without a value, like the reward of an env whose rollouts all failed, is null)."""
        check_earlier_results(self.config, [env.name for env in self.envs])
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
        write_summary(self.config.output_dir, summary)
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

    def plan(self, env: EnvHandle) -> EvalGrid:
        """The env's grid, holding an earlier eval's successes when resuming."""
        grid = EvalGrid(env, env.config, seed=self.config.seed)
        if self.config.resume is not None:
            grid.resume(*read_earlier(self.config.results_file(grid.name), grid.name, grid.n, grid.r))
        return grid

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
