"""Weights in memory: rank 0 broadcasts a policy into every replica, no file between; a replica receives only with
the secret from the token-protected request, through a rendezvous that proves it back (docs/inference.md)."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from loguru import logger

from envrl.data.layout import published_steps, weights_dir, weights_root
from envrl.runtime.atomic import atomic_dir, write_file
from envrl.transport.broadcast import join_gloo, nccl_unique_id, send_gloo, send_nccl
from envrl.transport.files import Shapes, WeightsError, check_shapes
from envrl.transport.rendezvous import RendezvousError, RendezvousServer, RendezvousStore, new_secret
from envrl.transport.transfer_files import (
    SECRET_FILE,
    TRANSFER_FILE,
    Backend,
    TransferInfo,
    TransferSecret,
)

# The files' readers, also importable from here (scripts/bench/weights_handoff.py, the trainer's tests).
from envrl.transport.transfer_files import read_secret as read_secret
from envrl.transport.transfer_files import read_transfer as read_transfer

WORLD_SIZE_KEY = "world_size"
"""Set by the replicas in the trainer's rendezvous: 1 + the number of receiving workers (from
the request that has them load the policy)."""
MAX_WORLD_SIZE = 1 + 4096


class TransferError(RuntimeError):
    """An in-memory transfer did not complete; the message says which side and what to check."""


def publish_transfer(target: Path, content: bytes, secret: TransferSecret) -> None:
    """Publish `target` (`weights/step_<k>/`) holding `transfer.json` (`content`) and
    `transfer.secret`, readable and writable by this user only from its creation."""
    with atomic_dir(target) as tmp:
        fd = os.open(tmp / SECRET_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret.model_dump_json().encode())
        write_file(tmp / TRANSFER_FILE, content)


def remove_stale_transfers(output_dir: Path) -> list[int]:
    """Remove every policy of `output_dir` sent in memory (its sender died with the trainer
    process that published it: a replica must not load it from a process that took its port)
    and return their steps. Only directories holding nothing but what envrl wrote there
    (`transfer.json`, `transfer.secret`) are removed; another is left, with a warning."""
    removed = []
    for step in published_steps(weights_root(output_dir)):
        path = weights_dir(output_dir, step)
        names = {entry.name for entry in path.iterdir()}
        if TRANSFER_FILE not in names:
            continue
        if path.is_symlink() or not names <= {TRANSFER_FILE, SECRET_FILE}:
            logger.warning(f"{path} names a policy sent in memory but holds more than envrl wrote; left in place")
            continue
        for name in names:
            (path / name).unlink()
        path.rmdir()
        removed.append(step)
    if removed:
        logger.info(
            f"removed policies {removed}, sent in memory by an earlier trainer process (republished as trained)"
        )
    return removed


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
            secret=new_secret(), nccl_unique_id_b64=nccl_unique_id() if backend == "nccl" else None
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
                    send_nccl(base64.b64decode(self.secret.nccl_unique_id_b64), world_size, self._tensors)
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


def check_receivable(path: Path, info: TransferInfo, engine_backend: str | None, served: Shapes) -> None:
    """WeightsError unless a replica whose weight-transfer engine is `engine_backend` and which
    serves tensors `served` can receive the policy `info` (published at `path`) in place."""
    if info.backend != engine_backend:
        raise WeightsError(
            f"{path} is sent in memory over {info.backend}, but this server's weight-transfer engine is "
            f'{engine_backend}; set inference.vllm.weight_transfer_config = {{backend = "{info.backend}"}}'
        )
    check_shapes(dict(zip(info.names, map(tuple, info.shapes), strict=True)), served, str(path))


@dataclass(frozen=True)
class Joined:
    """A policy sent in memory whose sender proved its secret: what it is, the secret, the rendezvous."""

    info: TransferInfo
    secret: TransferSecret
    store: RendezvousStore


def join_sender(path: Path, info: TransferInfo, secret: TransferSecret | None, timeout_s: float) -> Joined:
    """The rendezvous of the policy `info` (published at `path`), once its sender proved
    `secret` (the request's; RendezvousError otherwise, WeightsError without one): before
    anything of the replica is paused or touched."""
    if secret is None:
        raise WeightsError(
            f"{path} names a policy sent in memory, but the request carries no `transfer` secret; send the "
            "policy's transfer.secret in the body (envrl's orchestrator does)"
        )
    if info.backend == "nccl" and secret.nccl_unique_id_b64 is None:
        raise WeightsError(f"{path} is sent over nccl, but the request's `transfer` carries no nccl_unique_id_b64")
    return Joined(info, secret, RendezvousStore(info.host, info.port, secret.secret, timeout_s))


async def receive_policy(engine: Any, joined: Joined, replica: int, replicas: int, workers: int) -> None:
    """Receive the policy `joined` names into vLLM's `engine`, this server being receiver `replica`
    of `replicas`, each with `workers` workers (tensor x pipeline parallel): say in the proven
    rendezvous how many receive, then vLLM's weight-transfer calls (init, start, update, finish,
    always shut down), the tied output embeddings kept in step (envrl.inference.worker)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

    info = joined.info
    world_size = 1 + replicas * workers
    await asyncio.to_thread(joined.store.set, WORLD_SIZE_KEY, str(world_size))
    init_info = info.init_info(rank_offset=1 + replica * workers, world_size=world_size, secret=joined.secret)
    await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
    try:
        await engine.start_weight_update()
        await engine.update_weights(WeightTransferUpdateRequest(update_info=info.update_info()))
        await engine.finish_weight_update(weight_version=str(info.step))
        await engine.collective_rpc("envrl_retie_output_embeddings")
    finally:
        await engine.shutdown_weight_transfer_engine()
