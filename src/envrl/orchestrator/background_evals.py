"""Interval evals beside training: the first one to fail is raised at the loop's next step (or by `wait`), so a run
never goes on with an eval server down; `close` cancels and awaits every one still running."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from loguru import logger


class BackgroundEvals:
    """Interval evals running beside training; the first failure is kept for the loop to raise."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, evaluation: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(evaluation)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def raise_failure(self) -> None:
        """Raise the first failure of an eval (an eval env server that stayed down, say): the run
        must not go on blind."""
        if self._failure is not None:
            raise self._failure

    async def wait(self) -> None:
        """Wait for every running eval; raise the first failure."""
        if self._tasks:
            logger.info(f"waiting for {len(self._tasks)} evaluation(s) to finish")
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.raise_failure()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
