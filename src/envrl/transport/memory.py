"""Weights in memory: trainer rank 0 broadcasts a policy's tensors to every inference replica
through vLLM's weight-transfer engines, no file in between.

Guarantee: a `PolicySender` publishes `weights/step_<k>/transfer.json` (atomically: the
address the replicas join and the name, dtype and shape of every tensor, in order), and from a
thread, without holding up training, waits for the replicas to join (they say how many they
are) and broadcasts the tensors in that order; `served` is set once every replica received
them, `error` says what broke otherwise. Both ends cut the stream into the same buckets (`plan_buckets`, from the
metadata alone), so no length travels with the data. `backend` is vLLM's `nccl` on GPU or
envrl's `gloo` engine (`envrl.inference.transfer`, registered with vLLM's factory) on CPU: the
same rendezvous, the same vLLM calls on the replica, only the collective differs.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from loguru import logger
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
        nbytes = tensor_bytes(dtype_name, shape)
        if not buckets or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def tensor_bytes(dtype_name: str, shape: Sequence[int]) -> int:
    numel = 1
    for n in shape:
        numel *= n
    return numel * getattr(torch, dtype_name).itemsize


def gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=timeout_s))


def broadcast_gloo(group: dist.ProcessGroupGloo, buffer: torch.Tensor) -> dist.Work:
    """Start broadcasting `buffer` from rank 0 (gloo runs it on its own thread); `.wait()` it."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)


def send_gloo(group: dist.ProcessGroupGloo, tensors: Sequence[torch.Tensor], info: TransferInfo) -> None:
    """Broadcast `tensors` from rank 0, one flat byte buffer per bucket; the next bucket is
    packed while the previous one is on the wire."""
    in_flight: dist.Work | None = None
    for bucket in plan_buckets(info.dtype_names, info.shapes, info.bucket_bytes):
        parts = [tensors[i].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for i in bucket]
        buffer = torch.cat(parts) if len(parts) > 1 else parts[0]
        if in_flight is not None:
            in_flight.wait()
        in_flight = broadcast_gloo(group, buffer)
    if in_flight is not None:
        in_flight.wait()


def receive_gloo(group: dist.ProcessGroupGloo, info: TransferInfo) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The `(name, tensor)` pairs of each bucket, as it arrives (on CPU); the next bucket is
    received while the caller loads this one."""
    buckets = plan_buckets(info.dtype_names, info.shapes, info.bucket_bytes)

    def post(bucket: list[int]) -> tuple[torch.Tensor, dist.Work]:
        buffer = torch.empty(sum(tensor_bytes(info.dtype_names[i], info.shapes[i]) for i in bucket), dtype=torch.uint8)
        return buffer, broadcast_gloo(group, buffer)

    pending = post(buckets[0]) if buckets else None
    for n, bucket in enumerate(buckets):
        assert pending is not None
        buffer, work = pending
        work.wait()
        pending = post(buckets[n + 1]) if n + 1 < len(buckets) else None
        out, offset = [], 0
        for i in bucket:
            size = tensor_bytes(info.dtype_names[i], info.shapes[i])
            dtype = getattr(torch, info.dtype_names[i])
            out.append((info.names[i], buffer[offset : offset + size].view(dtype).reshape(info.shapes[i])))
            offset += size
        yield out


class PolicySender:
    """Serves one published policy from trainer rank 0: opens a store on a free port, publishes
    `transfer.json` through `publish`, and from a thread waits up to `timeout_s` for the
    replicas (they set how many they are), then broadcasts `named` to them, once. The tensors
    must be the sender's own (a snapshot): training goes on meanwhile."""

    def __init__(
        self,
        step: int,
        named: Sequence[tuple[str, torch.Tensor]],
        *,
        backend: Backend,
        host: str,
        timeout_s: float,
        bucket_bytes: int,
        publish: Callable[[bytes], None],
    ) -> None:
        self.step = step
        self.timeout_s = timeout_s
        self.store = dist.TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
        )
        self.info = TransferInfo(
            step=step,
            backend=backend,
            host=host,
            port=self.store.port,
            names=[n for n, _ in named],
            dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in named],
            shapes=[list(t.shape) for _, t in named],
            bucket_bytes=bucket_bytes,
        )
        self._tensors: list[torch.Tensor] | None = [t for _, t in named]
        self._device = torch.cuda.current_device() if backend == "nccl" else None
        """The trainer's GPU (the current device is per thread, so the sender's thread sets it)."""
        self.served = threading.Event()
        """Set once every replica that came received the whole policy."""
        self.error: TransferError | None = None
        """Set when the broadcast broke (not when nobody came: a newer policy may have been loaded)."""
        self.sending = threading.Event()
        publish(self.info.model_dump_json().encode())
        self._thread = threading.Thread(target=self._serve, name=f"policy-{step}-sender", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        info, start = self.info, time.monotonic()
        try:
            self.store.wait([WORLD_SIZE_KEY], datetime.timedelta(seconds=self.timeout_s))
            world_size = int(self.store.get(WORLD_SIZE_KEY))
        except (RuntimeError, dist.DistError, ValueError) as e:
            logger.warning(f"no inference replica came for policy {self.step} within {self.timeout_s:g} s ({e})")
            return
        if world_size < 2 or self._tensors is None:  # closed: a newer policy serves already
            return
        self.sending.set()
        waited, start = time.monotonic() - start, time.monotonic()
        try:
            if info.backend == "gloo":
                send_gloo(gloo_group(self.store, 0, world_size, self.timeout_s), self._tensors, info)
            else:
                torch.cuda.set_device(self._device)
                _send_nccl(self.store, world_size, self._tensors)
        except (RuntimeError, dist.DistError) as e:
            self.error = TransferError(
                f"broadcasting policy {self.step} to {world_size - 1} inference workers ({info.backend}) failed: {e}; "
                "see the inference replicas' logs"
            )
            return
        finally:
            self._tensors = None
        logger.info(
            f"policy {self.step} sent in memory to {world_size - 1} inference workers ({info.backend}): they came "
            f"{waited:.2f} s after it was published, the broadcast took {time.monotonic() - start:.2f} s"
        )
        self.served.set()

    def close(self) -> None:
        """Stop serving: wait for a broadcast under way, else release the snapshot at once."""
        if not self.sending.is_set():
            self._tensors = None
            # wakes the thread if it still waits (through a connection of its own: the thread's waits on the other)
            dist.TCPStore(self.info.host, self.info.port, is_master=False).set(WORLD_SIZE_KEY, "0")
        self._thread.join(self.timeout_s)


def _send_nccl(store: dist.Store, world_size: int, tensors: Sequence[torch.Tensor]) -> None:
    """vLLM's own packed NCCL broadcast (the sender side of its `nccl` engine); GPU only."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer
    from vllm.utils.nccl import unpinned_nccl_env

    device = torch.cuda.current_device()
    with unpinned_nccl_env():  # as vLLM's own trainer-side rendezvous (nccl_common)
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
