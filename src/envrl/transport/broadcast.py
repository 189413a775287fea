"""The memory transport's collectives: `send_gloo`/`receive_gloo` move exactly a `TensorLayout`'s tensors in order,
in buckets both ends compute alone; a gloo group is joined only through a rendezvous that proved the secret."""

from __future__ import annotations

import base64
import datetime
import socket
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from envrl.transport.rendezvous import RendezvousStore
from envrl.transport.transfer_files import TensorLayout


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


def gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float, host: str) -> dist.ProcessGroupGloo:
    """A gloo group over `store` whose connections listen on `host` only (gloo's default device
    listens on the address the machine's hostname resolves to)."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def join_gloo(host: str, port: int, secret: str, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroupGloo:
    """Join, as `rank`, the gloo group of the policy whose rendezvous is `host:port` (proving
    `secret`; RendezvousError if either end cannot), listening on the address that routes there."""
    store = RendezvousStore(host, port, secret, timeout_s)
    try:
        return gloo_group(store, rank, world_size, timeout_s, local_address(host))
    finally:
        store.close()  # the group is formed: its connections are its own


def local_address(peer: str) -> str:
    """The address of this host that routes to `peer` (no packet is sent): where a receiver's
    gloo connections listen."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))
        return probe.getsockname()[0]


def broadcast_gloo(group: dist.ProcessGroupGloo, buffer: torch.Tensor) -> dist.Work:
    """Start broadcasting `buffer` from rank 0 (gloo runs it on its own thread); `.wait()` it."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)


def send_gloo(group: dist.ProcessGroupGloo, tensors: Sequence[torch.Tensor], info: TensorLayout) -> None:
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


def receive_gloo(group: dist.ProcessGroupGloo, info: TensorLayout) -> Iterator[list[tuple[str, torch.Tensor]]]:
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


def nccl_unique_id() -> str:
    """A fresh `ncclUniqueId` (its bootstrap root listens in this process), base64."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    unique_id = NCCLLibrary().ncclGetUniqueId()
    return base64.b64encode(bytes(unique_id.internal)).decode()


def send_nccl(unique_id: bytes, world_size: int, tensors: Sequence[torch.Tensor]) -> None:
    """vLLM's own packed NCCL broadcast (the sender side of its `nccl` engine) in a group the
    workers join from `unique_id`, as vLLM's `uid_init_process_group` does; GPU only."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer
    from vllm.utils.nccl import unpinned_nccl_env

    device = torch.cuda.current_device()
    with unpinned_nccl_env():  # as vLLM's own rendezvous (nccl_common)
        group = PyNcclCommunicator.from_unique_id_bytes(unique_id, rank=0, world_size=world_size, device=device)
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
