"""A receiver of the memory transport without vLLM: what one inference worker does to join a
policy's broadcast (say the group's size in the proven rendezvous, join, receive)."""

from __future__ import annotations

import torch

from envrl.transport.broadcast import join_gloo, receive_gloo
from envrl.transport.memory import WORLD_SIZE_KEY, TransferInfo, TransferSecret
from envrl.transport.rendezvous import RendezvousStore


def receive(info: TransferInfo, secret: TransferSecret, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """The tensors rank `rank` of `world_size` receives of the policy `info` describes."""
    store = RendezvousStore(info.host, info.port, secret.secret, timeout_s=60)
    try:
        store.set(WORLD_SIZE_KEY, str(world_size))
    finally:
        store.close()
    group = join_gloo(info.host, info.port, secret.secret, rank, world_size, timeout_s=60)
    return {name: tensor.clone() for bucket in receive_gloo(group, info) for name, tensor in bucket}
