"""The weights seam: the trainer publishes policy k, the orchestrator has every inference replica
load it.

Guarantee: a policy is published as `weights/step_<k>/` (all trainer ranks call `publish`; the
directory appears only complete), and `PolicyLoader.load(k)` returns only once every replica
serves policy k. What the directory holds decides how the weights travel, and the replica's
`POST /update_weights` reads it: HF safetensors or a LoRA adapter (the filesystem transport,
`envrl.trainer.weights.FileWeightPublisher`), or `transfer.json`, the address the trainer sends
the tensors from in memory (`envrl.trainer.weights.MemoryWeightPublisher`), whose secret
(`transfer.secret`, owner-only) the loader sends in the token-protected request body. Checkpoints and
`weights/final/` are files whatever the transport.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from envrl.data.layout import published_steps, weights_dir, weights_root
from envrl.model.replicas import InferenceReplicas, ReplicaReloadError
from envrl.transport import TRANSFER_FILE
from envrl.transport.memory import is_transfer_dir, read_secret

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
    def latest(self) -> int:
        """The newest published policy (0: the initial model)."""
        ...

    async def load(self, step: int) -> None:
        """Make every replica serve policy `step`; raise naming the replicas that failed."""
        ...

    def discard(self, step: int) -> None:
        """Policy `step` will not be loaded again: free what publishing it kept."""
        ...


def file_policies(output_dir: Path) -> list[int]:
    """The published policies a replica can start from or load alone: those written as files
    (not the ones sent in memory, whose sender has moved on), oldest first."""
    root = weights_root(output_dir)
    return [step for step in published_steps(root) if not (weights_dir(output_dir, step) / TRANSFER_FILE).is_file()]


class ReplicaPolicyLoader:
    """Loads `weights/step_<k>/` of `output_dir` on every replica at once with `POST
    /update_weights`; a replica that does not answer (restarting) is waited for up to `timeout`
    s, then every replica is asked once more (a loaded step is a no-op there)."""

    def __init__(self, inference: InferenceReplicas, output_dir: Path, timeout: float) -> None:
        self.inference = inference
        self.output_dir = output_dir
        self.timeout = timeout

    def latest(self) -> int:
        steps = published_steps(weights_root(self.output_dir))
        return steps[-1] if steps else 0

    async def load(self, step: int) -> None:
        path = weights_dir(self.output_dir, step)
        transfer = read_secret(path).model_dump() if is_transfer_dir(path) else None
        try:
            await self.inference.update_weights(path, step=step, transfer=transfer)
        except ReplicaReloadError as e:
            if not e.unanswered:
                raise
            logger.warning(f"{e}; waiting up to {self.timeout:g} s for every replica to serve, then loading again")
            await self.inference.wait_until_ready(self.timeout)
            await self.inference.update_weights(path, step=step, transfer=transfer)

    def discard(self, step: int) -> None:
        shutil.rmtree(weights_dir(self.output_dir, step), ignore_errors=True)
