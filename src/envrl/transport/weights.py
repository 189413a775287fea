"""The weights seam: a policy appears as `weights/step_<k>/` only complete, and `PolicyLoader.load(k)` returns only
once every replica serves it; checkpoints and `weights/final/` are files whatever the transport."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from envrl.data.layout import published_steps, weights_dir, weights_root
from envrl.model.replicas import InferenceReplicas, ReplicaReloadError
from envrl.transport.source import transport_of
from envrl.transport.transfer_files import read_secret

if TYPE_CHECKING:
    from torch import nn


class WeightPublisher(Protocol):
    def publish(self, model: nn.Module, step: int, *, last: bool) -> bool:
        """Publish `model` as policy `step` (every trainer rank calls this); False if policy
        `step` was published already (before a resume) and is kept. `last`: the run's final
        policy, which is always written as files (it outlives the run)."""
        ...

    def close(self) -> None:
        """The trainer is done: finish what is being sent, release what is held."""
        ...


class PolicyLoader(Protocol):
    def published(self) -> list[int]:
        """The published policies, oldest first."""
        ...

    def where(self, step: int) -> str:
        """Where policy `step` is published, for messages."""
        ...

    async def load(self, step: int) -> None:
        """Make every replica serve policy `step`; raise naming the replicas that failed."""
        ...

    async def load_base(self, model: str) -> bool:
        """Make every replica serve `model`, the weights the run starts from, unless all do;
        whether it had to load them."""
        ...

    def discard(self, step: int) -> None:
        """Policy `step` will not be loaded again: free what publishing it kept."""
        ...


def file_policies(output_dir: Path) -> list[int]:
    """The published policies a replica can start from or load alone: those written as files
    (not the ones sent in memory, whose sender has moved on), oldest first."""
    root = weights_root(output_dir)
    return [step for step in published_steps(root) if transport_of(weights_dir(output_dir, step)) != "memory"]


class ReplicaPolicyLoader:
    """Loads `weights/step_<k>/` of `output_dir` on every replica at once with `POST
    /update_weights`; a replica that does not answer (restarting) is waited for up to `timeout`
    s, then every replica is asked once more (a loaded step is a no-op there)."""

    def __init__(self, inference: InferenceReplicas, output_dir: Path, timeout: float) -> None:
        self.inference = inference
        self.output_dir = output_dir
        self.timeout = timeout

    def published(self) -> list[int]:
        return published_steps(weights_root(self.output_dir))

    def where(self, step: int) -> str:
        return str(weights_dir(self.output_dir, step))

    async def load(self, step: int) -> None:
        start = time.monotonic()
        path = weights_dir(self.output_dir, step)
        transfer = read_secret(path).model_dump() if transport_of(path) == "memory" else None
        try:
            await self.inference.update_weights(path, step=step, transfer=transfer)
        except ReplicaReloadError as e:
            if not e.unanswered:
                raise
            logger.warning(f"{e}; waiting up to {self.timeout:g} s for every replica to serve, then loading again")
            await self.inference.wait_until_ready(self.timeout)
            await self.inference.update_weights(path, step=step, transfer=transfer)
        replicas = len(self.inference.clients)
        where = "inference now serves" if replicas == 1 else f"all {replicas} inference replicas now serve"
        logger.info(f"{where} policy {step} (reload took {time.monotonic() - start:.1f} s)")

    async def load_base(self, model: str) -> bool:
        if not Path(model).is_dir():
            return False
        want = str(Path(model).resolve())
        served = await self.inference.served_weights()
        stale = [f"replica {i} serves {path}" for i, path in enumerate(served) if path != want]
        if not stale:
            return False
        logger.warning(f"{'; '.join(stale)}, not this run's model: loading {want} before the first step")
        await self.inference.update_weights(want)
        return True

    def discard(self, step: int) -> None:
        shutil.rmtree(weights_dir(self.output_dir, step), ignore_errors=True)
