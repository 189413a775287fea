"""Config of the weight transport (`trainer.weights`): a validated `WeightsConfig` names one transport and one
collective; `rl` sets the replicas' side to match."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from envrl.config import BaseConfig

MEMORY_WITH_RESTARTS = (
    "trainer.weights.transport = 'memory' does not survive rl's self-recovery yet (a replica restarting during a "
    "reload breaks the transfer's group, and a restarted trainer cannot serve what it sent before): set "
    "restarts.max_restarts = 0, or use the filesystem transport"
)
"""Why `rl` refuses the memory transport with restarts (docs/inference.md)."""


class WeightsConfig(BaseConfig):
    """`trainer.weights`: how each step's policy reaches the inference replicas."""

    transport: Literal["filesystem", "memory"] = "filesystem"
    """`filesystem`: every policy as HF safetensors (or a LoRA adapter) in `weights/step_<k>/`,
    which each replica reads. `memory`: trainer rank 0 broadcasts the tensors into every
    replica through vLLM's weight-transfer engine (no disk); a LoRA adapter, the last policy and
    every `ckpt.interval`-th one are still files (a restarted replica starts from the newest)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """The collective of the memory transport: `auto` = nccl when the trainer runs on CUDA, else
    gloo. The replicas' engine must match (`inference.vllm.weight_transfer_config`; `rl` starts
    them with nccl on GPU, gloo on CPU)."""
    host: str = "127.0.0.1"
    """Address trainer rank 0 listens on for the replicas (memory transport), and only on it:
    loopback when they share the host, else an address they reach (the port is picked per policy)."""
    timeout_s: float = Field(1800.0, gt=0)
    """How long the trainer waits for the replicas to join a policy sent in memory; then its
    snapshot and rendezvous are released."""
    bucket_mb: ClassVar[int] = 256
    """Size of one broadcast buffer (gloo); tensors are packed into buffers of up to this."""
