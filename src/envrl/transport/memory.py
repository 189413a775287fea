"""Weights in memory: trainer rank 0 broadcasts a policy's tensors to every inference replica
through vLLM's weight-transfer engines, no file in between.

Guarantee: `send_policy` publishes `weights/step_<k>/transfer.json` (atomically: the address
the replicas join and the name, dtype and shape of every tensor, in order), waits up to
`timeout_s` for the replicas to join (they say how many they are), then broadcasts the tensors
in that order, and returns once every replica received them, or raises `TransferError` naming
what did not happen. Both ends cut the stream into the same buckets (`plan_buckets`, from the
metadata alone), so no length travels with the data. `backend` is vLLM's `nccl` on GPU or
envrl's `gloo` engine (`envrl.inference.transfer`, registered with vLLM's factory) on CPU: the
same rendezvous, the same vLLM calls on the replica, only the collective differs.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ValidationError

from envrl.transport import TRANSFER_FILE

TRANSFER_FORMAT = "envrl-weight-transfer/1"
WORLD_SIZE_KEY = "world_size"
"""Set by the replicas in the trainer's store: 1 + the number of receiving workers."""
DEFAULT_BUCKET_BYTES = 256 * 2**20

Backend = Literal["gloo", "nccl"]


class TransferError(RuntimeError):
    """An in-memory transfer did not complete; the message says which side and what to check."""


class TransferInfo(BaseModel):
    """`transfer.json`: where to receive policy `step` from and what it holds."""

    format: Literal["envrl-weight-transfer/1"] = TRANSFER_FORMAT
    step: int
    backend: Backend
    host: str
    port: int
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def update_info(self) -> dict[str, object]:
        """The per-round payload of vLLM's `update_weights` (the same fields for both backends)."""
        return {"names": self.names, "dtype_names": self.dtype_names, "shapes": self.shapes}

    def init_info(self, rank_offset: int, world_size: int) -> dict[str, object]:
        """The payload of vLLM's `init_weight_transfer_engine` for a replica whose first worker
        has rank `rank_offset` in a group of `world_size` (trainer rank 0 included)."""
        info: dict[str, object] = {
            "master_address": self.host,
            "master_port": self.port,
            "rank_offset": rank_offset,
            "world_size": world_size,
        }
        info.update({"packed": True} if self.backend == "nccl" else {"bucket_bytes": self.bucket_bytes})
        return info


def is_transfer_dir(path: Path) -> bool:
    return (path / TRANSFER_FILE).is_file()


def read_transfer(path: Path) -> TransferInfo:
    """The `TransferInfo` in directory `path`; ValueError naming the file if unreadable."""
    file = path / TRANSFER_FILE
    try:
        return TransferInfo.model_validate_json(file.read_bytes())
    except (OSError, ValidationError) as e:
        raise ValueError(f"{file} is not a readable weight-transfer file: {e}") from None


def plan_buckets(dtype_names: Sequence[str], shapes: Sequence[Sequence[int]], bucket_bytes: int) -> list[list[int]]:
    """Tensor indices per bucket, in order: consecutive tensors up to `bucket_bytes` together; a
    larger tensor travels alone. Both ends compute it from the metadata."""
    buckets: list[list[int]] = []
    size = 0
    for i, (dtype_name, shape) in enumerate(zip(dtype_names, shapes, strict=True)):
        nbytes = _nbytes(dtype_name, shape)
        if not buckets or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def _nbytes(dtype_name: str, shape: Sequence[int]) -> int:
    numel = 1
    for n in shape:
        numel *= n
    return numel * getattr(torch, dtype_name).itemsize


def gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=timeout_s))


def broadcast_gloo(group: dist.ProcessGroupGloo, buffer: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([buffer], options).wait()


def send_gloo(group: dist.ProcessGroupGloo, tensors: Sequence[torch.Tensor], info: TransferInfo) -> None:
    """Broadcast `tensors` from rank 0, one flat byte buffer per bucket."""
    for bucket in plan_buckets(info.dtype_names, info.shapes, info.bucket_bytes):
        parts = [tensors[i].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for i in bucket]
        broadcast_gloo(group, torch.cat(parts) if len(parts) > 1 else parts[0])


def receive_gloo(group: dist.ProcessGroupGloo, info: TransferInfo) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The `(name, tensor)` pairs of each bucket, as it arrives (on CPU)."""
    for bucket in plan_buckets(info.dtype_names, info.shapes, info.bucket_bytes):
        sizes = [_nbytes(info.dtype_names[i], info.shapes[i]) for i in bucket]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        broadcast_gloo(group, buffer)
        out, offset = [], 0
        for i, size in zip(bucket, sizes, strict=True):
            dtype = getattr(torch, info.dtype_names[i])
            out.append((info.names[i], buffer[offset : offset + size].view(dtype).reshape(info.shapes[i])))
            offset += size
        yield out


def send_policy(
    step: int,
    named: Sequence[tuple[str, torch.Tensor]],
    *,
    backend: Backend,
    host: str,
    timeout_s: float,
    bucket_bytes: int,
    publish: Callable[[bytes], None],
) -> float:
    """Broadcast `named` as policy `step` to the replicas that join; `publish` writes the
    `transfer.json` bytes it is given where the orchestrator finds them. Returns the seconds
    spent waiting for the replicas to join."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout, use_libuv=True)
    info = TransferInfo(
        step=step,
        backend=backend,
        host=host,
        port=store.port,
        names=[n for n, _ in named],
        dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in named],
        shapes=[list(t.shape) for _, t in named],
        bucket_bytes=bucket_bytes,
    )
    publish(info.model_dump_json().encode())
    start = time.monotonic()
    try:
        store.wait([WORLD_SIZE_KEY], timeout)
    except (RuntimeError, dist.DistStoreError) as e:
        raise TransferError(
            f"no inference replica came for policy {step} at {host}:{store.port} within {timeout_s:g} s "
            f"(trainer.weights.timeout_s): is the orchestrator running and loading policies? ({e})"
        ) from None
    waited = time.monotonic() - start
    world_size = int(store.get(WORLD_SIZE_KEY))
    tensors = [t for _, t in named]
    try:
        if backend == "gloo":
            send_gloo(gloo_group(store, 0, world_size, timeout_s), tensors, info)
        else:
            _send_nccl(store, world_size, tensors)
    except (RuntimeError, dist.DistError) as e:
        raise TransferError(
            f"broadcasting policy {step} to {world_size - 1} inference workers ({backend}) failed: {e}; "
            "see the inference replicas' logs"
        ) from None
    return waited


def _send_nccl(store: dist.Store, world_size: int, tensors: Sequence[torch.Tensor]) -> None:
    """vLLM's own packed NCCL broadcast (the sender side of its `nccl` engine); GPU only."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

    device = torch.cuda.current_device()
    group = PyNcclCommunicator(StatelessProcessGroup(rank=0, world_size=world_size, store=store), device=device)
    try:
        packed_nccl_broadcast_producer(
            iterator=((None, t.to(device)) for t in tensors),
            group=group,
            src=0,
            post_iter_func=lambda item: item[1],
        )
        torch.cuda.current_stream().synchronize()
    finally:
        group.destroy()
