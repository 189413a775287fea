"""An env behind its server: a rollout call returns one Trace per rollout asked for (errors retried `max_retries` times,
a lost server waited for up to `reconnect_timeout_s`), and a server serving another model client is refused."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from loguru import logger

from envrl.config import ConfigError
from envrl.data.seeds import attempt_seed
from envrl.data.traces import Error, Split, Trace, WireTask
from envrl.envclient.client import UNAVAILABLE, EnvClient, EnvServerError
from envrl.envclient.config import DeclaredEnvConfig, EnvConfig
from envrl.envclient.plan import PlannedEnv, plan_env
from envrl.envclient.sidecars import Sidecars
from envrl.model.client import ClientConfig, SamplingArgs, SamplingParams
from envrl.serve.config import KILL_GRACE_S, client_flags
from envrl.serve.launch import EnvServerLaunch
from envrl.serve.protocol import ClientInfo, ServerInfo

CLIENT_SLACK = 30.0
"""Seconds a client waits beyond the server's own rollout deadline before giving up on a call."""


class EnvUnavailable(RuntimeError):
    """An env server that did not come back (the message names it, its address and the config key)."""


class EnvClientMismatch(ConfigError):
    """An env server whose model client is not the one the run planned (the message names both and
    the `--client` the server needs): a wiring mistake, reported as one line."""


C = TypeVar("C", bound=EnvConfig)


class EnvHandle(Generic[C]):
    """One environment behind its env server, with this run's client and sampling args; `config`
    is the env's table (`EnvHandle[DeclaredEnvConfig]` for a train env)."""

    def __init__(
        self,
        config: C,
        *,
        split: Split,
        client: ClientConfig,
        sampling: SamplingParams,
        ready_timeout: float,
        sidecars: Sidecars | None = None,
        server: EnvServerLaunch | None = None,
        counters: Counter[str] | None = None,
    ) -> None:
        if server is None and config.address is None and sidecars is not None:  # a handle built by hand
            planned = plan_env(config, split, client, sidecars.restarts, curve=sidecars.curve)
            config, client, server = planned.env, planned.client, planned.server
        self.config = config
        """The env as this handle connects (a sidecar's: with its client keys)."""
        self.name = config.resolved_name
        self.split = split
        self.client_config = client
        """The model client its rollouts use: what its server must serve (`expected_client`)."""
        self.sampling: SamplingArgs = config.sampling_args(sampling)
        self.sidecars = sidecars
        """Where the server of an env without `address` comes from (and is restarted, and stopped)."""
        self.server = server
        """The server `sidecars` spawns for an env without `address`, as planned (`envclient/plan.py`);
        default: the plan of `config` for `client` behind the sidecars' keys, for a handle built by hand."""
        self.ready_timeout = ready_timeout
        self.num_tasks = 0
        self.group_scoring = False
        self.counters: Counter[str] = Counter() if counters is None else counters
        """`retried_rollouts`, `env_server_losses`, `env_server_restarts` of this env (shared by the caller)."""
        self._client: EnvClient | None = None
        self._back: asyncio.Task[None] | None = None
        """The one wait for a lost server to answer again, shared by every call that lost it."""

    @classmethod
    def of(
        cls, planned: PlannedEnv[C], sidecars: Sidecars, sampling: SamplingParams, counters: Counter[str] | None = None
    ) -> EnvHandle[C]:
        """The handle of a `planned` env (`env_plan`): its client, its server external or spawned by
        `sidecars`, given the sidecars' `ready_timeout` to answer."""
        return cls(
            planned.env,
            split=planned.split,
            client=planned.client,
            sampling=sampling,
            ready_timeout=sidecars.ready_timeout,
            sidecars=sidecars,
            server=planned.server,
            counters=counters,
        )

    @property
    def expected_client(self) -> ClientInfo:
        """What the server's `info` must report as its client."""
        return ClientInfo.of(self.client_config)

    @property
    def address(self) -> str:
        if self._client is None:
            raise RuntimeError(f"env {self.name!r} is not started")
        return self._client.address

    async def start(self) -> None:
        """Connect to the configured address, or to a sidecar server `sidecars` spawns; then read its info."""
        address = self.config.address
        if address is None:
            if self.sidecars is None or self.server is None:
                raise RuntimeError(
                    f"{self.split} env {self.name!r} has no `address` and no `Sidecars` to spawn its server"
                )
            address = await self.sidecars.serve(self.server, self._count_restart)
        timeout = self.config.timeout.rollout_s
        self._client = EnvClient(
            address,
            timeout=None if timeout is None else timeout + KILL_GRACE_S + CLIENT_SLACK,
            curve=self.config.curve,
            capacity_wait=self.config.at_capacity_wait_s,
            on_at_capacity=self._count_at_capacity,
        )
        info = self._checked(await self._client.wait_until_ready(self.ready_timeout), address)
        self.num_tasks = info.num_tasks if self.split == "train" else info.num_eval_tasks
        self.group_scoring = info.group_scoring
        if self.num_tasks == 0:
            raise RuntimeError(f"{self.split} env {self.name!r} at {address} has no {self.split} tasks")
        logger.info(
            f"{self.split} env {self.name!r} ready at {address}: {self.num_tasks} tasks, "
            f"{'group' if self.group_scoring else 'per-rollout'} scoring, {info.workers} workers"
        )

    def _checked(self, info: ServerInfo, address: str) -> ServerInfo:
        """`info`, once it shows the model client this handle expects; else `EnvClientMismatch`."""
        if info.client != self.expected_client:
            served = "no model client" if info.client is None else f"the client {info.client}"
            where = "external server (`address`)" if self.config.address is not None else "server"
            raise EnvClientMismatch(
                f"{self.split} env {self.name!r}: the {where} at {address} serves {served}, but this run's rollouts "
                f"of it use {self.expected_client}; start that server with `{client_flags(self.client_config)}` "
                "(docs/protocol.md), or point the env at a server that does"
            )
        return info

    def _count_at_capacity(self) -> None:
        self.counters["at_capacity_retries"] += 1

    def _count_restart(self) -> None:
        self.counters["env_server_restarts"] += 1

    async def shutdown(self) -> None:
        """Stop waiting and close the connection (a sidecar server is stopped by its `Sidecars`)."""
        if self._back is not None:
            self._back.cancel()
            await asyncio.gather(self._back, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def run_group(self, task_idx: int, n: int, seed: int, attempt: int = 0) -> list[Trace]:
        """`n` rollouts of one task: one call of n for group-scored envs, else `n` calls of one
        (spread over the server's workers, each retried on its own).

        Rollout i samples with seed `seed + i`; retries (and `attempt` > 0: callers re-running
        rollouts that failed before) sample with salted seeds (`attempt_seed`).
        """
        if self.group_scoring:
            return await self._with_retries(
                task_idx, n, attempt, lambda a: self._call(task_idx, n, attempt_seed(seed, a))
            )
        singles = [
            self._with_retries(task_idx, 1, attempt, lambda a, i=i: self._call(task_idx, 1, attempt_seed(seed + i, a)))
            for i in range(n)
        ]
        return [trace for traces in await asyncio.gather(*singles) for trace in traces]

    async def _call(self, task_idx: int, n: int, seed: int) -> list[Trace]:
        assert self._client is not None
        return await self._client.run(task_idx, n=n, sampling=self.sampling, split=self.split, seed=seed)

    async def _with_retries(
        self, task_idx: int, n: int, first_attempt: int, call: Callable[[int], Awaitable[list[Trace]]]
    ) -> list[Trace]:
        """`call(attempt)` (n rollouts) until it has no error Trace or `max_retries` re-runs are spent
        (each re-run samples with a salted seed); a call lost with its server is re-run with the same
        seed once the server is back, outside that budget."""
        attempt = 0
        while True:
            try:
                traces = await call(first_attempt + attempt)
            except EnvServerError as e:
                if e.type == UNAVAILABLE:
                    self.counters["retried_rollouts"] += n
                    await self._wait_until_back()
                    continue
                traces = [
                    Trace.from_error(WireTask(idx=task_idx), Error(type=e.type, message=str(e))) for _ in range(n)
                ]
            if attempt == self.config.max_retries or not any(t.has_error for t in traces):
                return traces
            attempt += 1
            self.counters["retried_rollouts"] += n
            first = next(t.error for t in traces if t.error is not None)
            logger.debug(
                f"env {self.name!r} task {task_idx}: retry {attempt} after {first.type}: {first.message[:200]}"
            )

    async def _wait_until_back(self) -> None:
        if self._back is None or self._back.done():
            self.counters["env_server_losses"] += 1
            self._back = asyncio.create_task(self._reconnect())
        await asyncio.shield(self._back)  # a cancelled rollout must not cancel everybody's wait

    async def _reconnect(self) -> None:
        """Wait for the server to answer health again (a sidecar: while its `Sidecars` restart it)."""
        assert self._client is not None
        address, timeout = self._client.address, self.config.reconnect_timeout_s
        logger.warning(
            f"{self.split} env {self.name!r}: lost the server at {address}; waiting up to {timeout:g} s for it"
        )
        back = asyncio.ensure_future(self._client.wait_until_ready(timeout))
        ended = asyncio.ensure_future(self.sidecars.ended()) if self.config.address is None and self.sidecars else None
        try:
            await asyncio.wait([w for w in (back, ended) if w is not None], return_when=asyncio.FIRST_COMPLETED)
            if not back.done():
                assert ended is not None
                raise EnvUnavailable(str(ended.result())) from None
            self._checked(back.result(), address)
        except EnvServerError as e:
            raise EnvUnavailable(
                f"{self.split} env {self.name!r}: the env server at {address} did not answer again within {timeout:g} s "
                f"({e}); restart it"
            ) from None
        finally:
            for wait in (back, ended):
                if wait is not None:
                    wait.cancel()
        logger.info(f"{self.split} env {self.name!r}: the server at {address} answers again; lost rollouts are re-run")


class TrainEnvs:
    """The train envs: picks an env by ratio and a task by a seeded per-epoch shuffle."""

    def __init__(
        self, envs: list[EnvHandle[DeclaredEnvConfig]], seed: int, positions: dict[str, int] | None = None
    ) -> None:
        self.envs = envs
        self.seed = seed
        self.positions: dict[str, int] = {env.name: 0 for env in envs} | (positions or {})
        """Tasks drawn so far per env (across epochs); with the seed, all the sampling state."""
        self._orders: dict[str, tuple[int, list[int]]] = {}

    def shares(self) -> dict[str, float]:
        """Target share of rollouts per env: configured ratios, or task counts if none are set."""
        weights = {
            env.name: env.config.ratio if env.config.ratio is not None else float(env.num_tasks) for env in self.envs
        }
        total = sum(weights.values())
        return {name: w / total for name, w in weights.items()}

    def by_name(self, name: str) -> EnvHandle[DeclaredEnvConfig]:
        """The train env called `name` (resumed pending groups name their env)."""
        for env in self.envs:
            if env.name == name:
                return env
        raise KeyError(
            f"the resumed run has a train env {name!r} this config lacks (train envs: {[e.name for e in self.envs]})"
        )

    def pick(self, rng: random.Random) -> EnvHandle[DeclaredEnvConfig]:
        shares = self.shares()
        return rng.choices(self.envs, weights=[shares[env.name] for env in self.envs])[0]

    def next_task(self, env: EnvHandle) -> int:
        """The next task index of `env`: every task once per epoch, in a seeded shuffled order."""
        position = self.positions[env.name]
        epoch, offset = divmod(position, env.num_tasks)
        cached_epoch, order = self._orders.get(env.name, (-1, []))
        if cached_epoch != epoch:
            order = list(range(env.num_tasks))
            random.Random(f"{self.seed}/{env.name}/{epoch}").shuffle(order)
            self._orders[env.name] = (epoch, order)
        self.positions[env.name] = position + 1
        return order[offset]
