"""envrl's `gloo` weight-transfer engine, the CPU twin of vLLM's `nccl`: a worker joins only through the rendezvous
proving the policy's secret, and a broken transfer raises, failing the caller's reload."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from envrl.transport.broadcast import join_gloo, receive_gloo
from envrl.transport.transfer_files import DEFAULT_BUCKET_BYTES, TensorLayout

BACKEND = "gloo"
GROUP_TIMEOUT_S = 300.0
"""How long a worker waits for the group to form (reaching the rendezvous is quicker: a dead
sender is not waited for, envrl.transport.rendezvous.CONNECT_TIMEOUT_S)."""


@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):
    """The fields of vLLM's `NCCLWeightTransferInitInfo` a TCP rendezvous needs, plus the bucket size."""

    master_address: str
    master_port: int
    secret: str = field(repr=False)  # vLLM logs init infos: keep the secret out of them
    """The policy's secret (envrl.transport.memory.TransferSecret), proven both ways."""
    rank_offset: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """Per round, as vLLM's `NCCLWeightTransferUpdateInfo`: what is broadcast, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: dist.ProcessGroupGloo | None = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        self.group = join_gloo(
            init_info.master_address,
            init_info.master_port,
            init_info.secret,
            rank,
            init_info.world_size,
            GROUP_TIMEOUT_S,
        )
        self.bucket_bytes = init_info.bucket_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        layout = TensorLayout(bucket_bytes=self.bucket_bytes, **update_info.__dict__)
        for bucket in receive_gloo(self.group, layout):
            self.model.load_weights(bucket)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's, without its `torch.accelerator.synchronize()` (there is no accelerator on CPU)."""
        self.receive_weights(self.parse_update_info(update_info))

    def shutdown(self) -> None:
        self.group = None


def register() -> None:
    """Make `--weight-transfer-config '{"backend": "gloo"}'` build this engine (idempotent)."""
    with contextlib.suppress(ValueError):  # registered already
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


register()
