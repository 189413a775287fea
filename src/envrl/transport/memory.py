"""Weights in memory: trainer rank 0 broadcasts a policy's tensors to every inference replica
through vLLM's weight-transfer engines, no file in between.

Guarantee: a `PolicySender` publishes `weights/step_<k>/transfer.json` (atomically: the
address the replicas join and the name, dtype and shape of every tensor, in order) with
`transfer.secret` beside it (owner-only: the policy's 128-bit secret, and on nccl the NCCL unique
id), and from a thread, without holding up training, waits up to `timeout_s` for the replicas
to join and broadcasts the tensors in that order; `served` is set once every replica received
them, `error` says what broke otherwise, and a policy nobody joins in time is released. The
replicas join through a `RendezvousServer` (envrl.transport.rendezvous) bound to the trainer's
host, which only holders of the secret can use and which proves the secret back: the secret
travels only in the token-protected `POST /update_weights` body, each replica says there how
many receive (the group's size), and a sender that cannot prove it is refused. Both ends cut
the stream into the same buckets (`plan_buckets`, from the metadata alone), so no length travels
with the data. `backend` is vLLM's `nccl` on GPU (the workers join from the NCCL unique id in the
body: no TCPStore, no pickle) or envrl's `gloo` engine (`envrl.inference.transfer`, registered
with vLLM's factory) on CPU, whose group forms over the rendezvous store.
"""

from __future__ import annotations

import base64
import datetime
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from loguru import logger
from pydantic import BaseModel, Field, ValidationError

from envrl.transport import TRANSFER_FILE
from envrl.transport.rendezvous import RendezvousError, RendezvousServer, RendezvousStore, new_secret

TRANSFER_FORMAT = "envrl-weight-transfer/1"
SECRET_FILE = "transfer.secret"
"""Beside `transfer.json`, readable by the run's user only: the `TransferSecret` of the policy."""
WORLD_SIZE_KEY = "world_size"
"""Set by the replicas in the trainer's rendezvous: 1 + the number of receiving workers (from
the request that has them load the policy)."""
MAX_WORLD_SIZE = 1 + 4096
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

    def init_info(self, rank_offset: int, world_size: int, secret: TransferSecret) -> dict[str, object]:
        """The payload of vLLM's `init_weight_transfer_engine` for a replica whose first worker
        has rank `rank_offset` in a group of `world_size` (trainer rank 0 included): on nccl
        the unique id alone (vLLM's workers then open no TCPStore), on gloo the rendezvous and
        its secret."""
        info: dict[str, object] = {"rank_offset": rank_offset, "world_size": world_size}
        if self.backend == "nccl":
            if secret.nccl_unique_id_b64 is None:
                raise ValueError(f"policy {self.step} is sent over nccl, but its secret carries no NCCL unique id")
            info.update({"nccl_unique_id_b64": secret.nccl_unique_id_b64, "packed": True})
        else:
            info.update(
                {
                    "master_address": self.host,
                    "master_port": self.port,
                    "secret": secret.secret,
                    "bucket_bytes": self.bucket_bytes,
                }
            )
        return info


class TransferSecret(BaseModel):
    """`transfer.secret`: what lets a replica join policy k's transfer; it travels only in the
    token-protected `/update_weights` body."""

    secret: str = Field(pattern=r"^[0-9a-f]{32}$")
    """128 bits, hex: both ends prove it to each other before the rendezvous is used."""
    nccl_unique_id_b64: str | None = Field(None, max_length=512)
    """nccl: the trainer's `ncclUniqueId` (base64), from which vLLM's workers join its group."""


def is_transfer_dir(path: Path) -> bool:
    return (path / TRANSFER_FILE).is_file()


def read_secret(path: Path) -> TransferSecret:
    """The `TransferSecret` in directory `path`; ValueError naming the file if unreadable."""
    file = path / SECRET_FILE
    try:
        return TransferSecret.model_validate_json(file.read_bytes())
    except (OSError, ValidationError) as e:
        raise ValueError(f"{file} is not a readable weight-transfer secret: {e}") from None


def write_secret(file: Path, secret: TransferSecret) -> None:
    """Write `secret` to the new `file`, readable and writable by this user only from its
    creation (into an `atomic_dir`, whose publishing fsyncs it)."""
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret.model_dump_json().encode())


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
    """Serves one published policy from trainer rank 0: opens a rendezvous on `host` under a
    fresh secret, publishes `transfer.json` and the secret through `publish`, and from a thread
    waits up to `timeout_s` for the replicas (the proven ones say how many receive), then
    broadcasts `named` to them, once; if none comes in time the snapshot is released. The
    tensors must be the sender's own (a snapshot): training goes on meanwhile."""

    def __init__(
        self,
        step: int,
        named: Sequence[tuple[str, torch.Tensor]],
        *,
        backend: Backend,
        host: str,
        timeout_s: float,
        bucket_bytes: int,
        publish: Callable[[bytes, TransferSecret], None],
    ) -> None:
        self.step = step
        self.timeout_s = timeout_s
        self.secret = TransferSecret(
            secret=new_secret(), nccl_unique_id_b64=_nccl_unique_id() if backend == "nccl" else None
        )
        self.rendezvous = RendezvousServer(host, self.secret.secret)
        self.info = TransferInfo(
            step=step,
            backend=backend,
            host=host,
            port=self.rendezvous.port,
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
        self._starting = threading.Lock()
        """Held while deciding between sending and releasing (the thread) or closing (`close`)."""
        publish(self.info.model_dump_json().encode(), self.secret)
        self._thread = threading.Thread(target=self._serve, name=f"policy-{step}-sender", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        info, start = self.info, time.monotonic()
        try:
            raw = self.rendezvous.wait_for(WORLD_SIZE_KEY, self.timeout_s)
            world_size = _world_size(raw)
            with self._starting:
                if world_size is None or self._tensors is None:
                    if raw is None and self._tensors is not None:
                        logger.warning(
                            f"no inference replica joined policy {self.step} within {self.timeout_s:g} s "
                            "(trainer.weights.timeout_s); its snapshot is released"
                        )
                    return
                self.sending.set()
            waited, start = time.monotonic() - start, time.monotonic()
            try:
                if info.backend == "gloo":
                    group = join_gloo(info.host, info.port, self.secret.secret, 0, world_size, self.timeout_s)
                    send_gloo(group, self._tensors, info)
                else:
                    torch.cuda.set_device(self._device)
                    assert self.secret.nccl_unique_id_b64 is not None
                    _send_nccl(base64.b64decode(self.secret.nccl_unique_id_b64), world_size, self._tensors)
            except (RuntimeError, dist.DistError, RendezvousError) as e:
                self.error = TransferError(
                    f"broadcasting policy {self.step} to {world_size - 1} inference workers ({info.backend}) failed: "
                    f"{e}; see the inference replicas' logs"
                )
                return
            logger.info(
                f"policy {self.step} sent in memory to {world_size - 1} inference workers ({info.backend}): they "
                f"came {waited:.2f} s after it was published, the broadcast took {time.monotonic() - start:.2f} s"
            )
            self.served.set()
        finally:
            self._tensors = None
            self.rendezvous.close()

    def close(self) -> None:
        """Stop serving: wait for a broadcast under way, else release the snapshot at once."""
        with self._starting:
            if not self.sending.is_set():
                self._tensors = None
        if not self.sending.is_set():
            self.rendezvous.close()  # wakes the thread if it still waits
        self._thread.join(self.timeout_s)


def _world_size(raw: bytes | None) -> int | None:
    """The group size the replicas set, or None (with a warning) if absent or implausible."""
    if raw is None:
        return None
    try:
        world_size = int(raw)
    except ValueError:
        world_size = -1
    if not 2 <= world_size <= MAX_WORLD_SIZE:
        logger.warning(f"a replica set world_size {raw[:32]!r}; expected 2..{MAX_WORLD_SIZE}: not sending")
        return None
    return world_size


def _nccl_unique_id() -> str:
    """A fresh `ncclUniqueId` (its bootstrap root listens in this process), base64."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    unique_id = NCCLLibrary().ncclGetUniqueId()
    return base64.b64encode(bytes(unique_id.internal)).decode()


def _send_nccl(unique_id: bytes, world_size: int, tensors: Sequence[torch.Tensor]) -> None:
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
