"""The batch seam: `receive(step)` gives exactly what `send(step, ...)` sent once complete, or raises `BatchTimeout`
past its deadline or `BatchError` for a corrupt batch."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from loguru import logger

from envrl.data.layout import batch_dir
from envrl.data.samples import TrainingSample, read_batch, write_batch


class BatchTimeout(TimeoutError):
    """No batch arrived within the receiver's deadline; the message says where and what to check."""


class BatchSender(Protocol):
    def send_batch(self, step: int, samples: Sequence[TrainingSample], extra: Mapping[str, bytes]) -> None:
        """Publish batch `step` with `extra` (name -> bytes, the sender's state) in one commit."""
        ...


class BatchReceiver(Protocol):
    def where(self, step: int) -> str:
        """Where batch `step` comes from, for messages."""
        ...

    def wait(self, step: int) -> float:
        """Block until batch `step` can be received; the seconds waited."""
        ...

    def receive(self, step: int) -> list[TrainingSample]:
        """The samples of batch `step` (after `wait`)."""
        ...


class FileBatchSender:
    """Batches as `rollouts/step_<n>/` directories under `output_dir`."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir

    def send_batch(self, step: int, samples: Sequence[TrainingSample], extra: Mapping[str, bytes]) -> None:
        write_batch(self.output_dir, step, samples, extra=extra)


POLL_S = 0.02
"""How often the trainer looks for its next batch directory (one `stat` each time)."""
WAIT_LOG_S = 30.0
"""How often a trainer still waiting for its batch says so."""


class FileBatchReceiver:
    """Polls `rollouts/step_<n>/` every `poll_s` until it appears, up to `timeout_s`."""

    def __init__(
        self, output_dir: Path, *, timeout_s: float, poll_s: float = POLL_S, log_every_s: float = WAIT_LOG_S
    ) -> None:
        self.output_dir = output_dir
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.log_every_s = log_every_s

    def where(self, step: int) -> str:
        return str(batch_dir(self.output_dir, step))

    def wait(self, step: int) -> float:
        path = batch_dir(self.output_dir, step)
        start = time.monotonic()
        next_log = start + self.log_every_s
        while not path.is_dir():
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise BatchTimeout(
                    f"no batch at {path} after {waited:.0f}s (trainer.batch_timeout_s = {self.timeout_s:g}); "
                    "is the orchestrator running? see its log"
                )
            if time.monotonic() >= next_log:
                logger.info(f"waiting for {path} ({waited:.0f}s so far, deadline {self.timeout_s:g}s)")
                next_log += self.log_every_s
            time.sleep(self.poll_s)
        return time.monotonic() - start

    def receive(self, step: int) -> list[TrainingSample]:
        return read_batch(batch_dir(self.output_dir, step))
