"""A bounded pool of warm sandboxes: at most `size` ready or starting; each is handed to one episode with its whole
cap and never returns; dead or aged ones are dropped, and `aclose()` closes all."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from loguru import logger

from envrl.sandbox.base import Sandbox, SandboxConfig, SandboxProvider
from envrl.sandbox.errors import SandboxError


class WarmPool(SandboxProvider):
    def __init__(
        self,
        provider: SandboxProvider,
        config: SandboxConfig,
        size: int,
        prepare: Callable[[Sandbox], Awaitable[None]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a warm pool needs size >= 1, got {size}")
        self.provider = provider
        self.config = config
        self.size = size
        self.prepare = prepare
        """Run on each warm sandbox before it waits in the pool (a sandbox it fails on is dropped)."""
        self._ready: deque[Sandbox] = deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._closed = False

    async def create(self, config: SandboxConfig) -> Sandbox:
        if config != self.config or self._closed:
            return await self.provider.create(config)
        while self._ready:
            box = self._ready.popleft()
            if box.alive:
                box.restart_clock()
                self._refill()
                return box
            await box.close()
        self._refill()
        return await self.provider.create(config)

    def _refill(self) -> None:
        while not self._closed and len(self._ready) + len(self._starting) < self.size:
            task = asyncio.get_running_loop().create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        try:
            box = await self.provider.create(self.config)
        except SandboxError as e:  # the episode that needs one starts it itself and sees the error
            logger.warning(f"warm pool: a sandbox failed to start: {e}")
            return
        if self.prepare is not None:
            try:
                await self.prepare(box)
            except BaseException as e:  # an episode then starts its own, unprepared
                await asyncio.shield(box.close())
                if not isinstance(e, Exception):
                    raise
                logger.warning(f"warm pool: preparing a sandbox failed: {type(e).__name__}: {e}")
                return
        if self._closed:
            await box.close()
        else:
            self._ready.append(box)

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        for task in list(self._starting):
            with contextlib.suppress(asyncio.CancelledError, SandboxError):
                await task
        while self._ready:
            await self._ready.popleft().close()
