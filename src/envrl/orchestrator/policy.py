"""`ensure(step)` returns once every replica serves a policy >= step - max_async_level, or raises naming what it
waited for; weight directories are deleted only once every replica serves newer, keeping `keep` and every
`keep_every`-th."""

from __future__ import annotations

import asyncio
import time

from loguru import logger

from envrl.telemetry.ledger import Ledger
from envrl.transport.weights import PolicyLoader

POLL_INTERVAL = 0.01
"""Seconds between looks for newly published weights while the trainer is below the bound: an
on-policy step waits for the trainer every step and loses half this on average, and a look lists
only one directory, so looking often costs little."""


class PolicyTracker:
    def __init__(
        self,
        loader: PolicyLoader,
        *,
        max_async_level: int,
        timeout: float,
        keep: int,
        keep_every: int = 0,
        current: int = 0,
        ledger: Ledger | None = None,
    ) -> None:
        self.loader = loader
        """How published policies reach the replicas (envrl.transport.weights): all the tracker knows of them."""
        self.max_async_level = max_async_level
        self.timeout = timeout
        self.keep = keep
        self.keep_every = keep_every
        self.current = current
        """The policy every inference replica serves (0: the initial model)."""
        self.waited = 0.0
        """Seconds spent waiting for the trainer in the last `ensure` call."""
        self.ledger = ledger or Ledger(None, "orchestrator")
        """Records `wait_policy` and the replicas' `reload_weights` pause (all of them, in parallel)."""

    async def start_from(self, base_model: str) -> None:
        """Make every replica serve the policy this run starts from: a server left on other weights
        (an earlier run's, when inference outlives the orchestrator) would otherwise sample step 0
        from a policy the trainer never had. With published weights, `ensure` loads the newest."""
        if self.latest_published() > self.current:
            return
        start = time.time()
        if await self.loader.load_base(base_model):
            self.ledger.record("reload_weights", 0, start, time.time(), process="inference", policy=0)

    def latest_published(self) -> int:
        """The newest published policy (0: the initial model)."""
        steps = self.loader.published()
        return steps[-1] if steps else 0

    async def ensure(self, step: int) -> None:
        """Serve the newest published policy; wait for the trainer if it is below the bound."""
        required = step - self.max_async_level
        start, wall_start = time.monotonic(), time.time()
        next_report = start + 30.0
        while self.latest_published() < required:
            now = time.monotonic()
            if now - start > self.timeout:
                raise TimeoutError(
                    f"waited {self.timeout:g} s (weights_timeout_s) for {self.loader.where(required)}; "
                    "is the trainer running and reading the batches?"
                )
            if now >= next_report:
                logger.info(f"step {step}: waiting for the trainer to publish policy {required} ({now - start:.0f} s)")
                next_report = now + 30.0
            await asyncio.sleep(POLL_INTERVAL)
        self.waited = time.monotonic() - start
        self.ledger.record("wait_policy", step, wall_start, time.time())
        latest = self.latest_published()
        if latest > self.current:
            with self.ledger.span("reload_weights", step, process="inference", policy=latest):
                await self._load(latest)

    async def _load(self, step: int) -> None:
        await self.loader.load(step)
        self.current = step
        for old in self.loader.published():
            kept_for_good = self.keep_every > 0 and old % self.keep_every == 0
            if old <= step - self.keep and not kept_for_good:
                self.loader.discard(old)
