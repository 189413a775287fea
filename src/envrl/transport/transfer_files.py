"""The only definitions of `transfer.json` and `transfer.secret`, each read back only through its pydantic model (a
ValueError naming the file otherwise); importing it imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

TRANSFER_FILE = "transfer.json"
"""In `weights/step_<k>/`: policy k is sent in memory, and this says from where."""
TRANSFER_FORMAT = "envrl-weight-transfer/1"
SECRET_FILE = "transfer.secret"
"""Beside `transfer.json`, readable by the run's user only: the `TransferSecret` of the policy."""
DEFAULT_BUCKET_BYTES = 256 * 2**20

Backend = Literal["gloo", "nccl"]


class TensorLayout(BaseModel):
    """What is broadcast, in order: each tensor's name, dtype and shape, cut into buckets of up
    to `bucket_bytes`."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


class TransferInfo(TensorLayout):
    """`transfer.json`: where to receive policy `step` from and what it holds (`TensorLayout`)."""

    format: Literal["envrl-weight-transfer/1"] = TRANSFER_FORMAT
    step: int
    backend: Backend
    host: str
    port: int

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


def read_secret(path: Path) -> TransferSecret:
    """The `TransferSecret` in directory `path`; ValueError naming the file if unreadable."""
    file = path / SECRET_FILE
    try:
        return TransferSecret.model_validate_json(file.read_bytes())
    except (OSError, ValidationError) as e:
        raise ValueError(f"{file} is not a readable weight-transfer secret: {e}") from None


def read_transfer(path: Path) -> TransferInfo:
    """The `TransferInfo` in directory `path`; ValueError naming the file if unreadable."""
    file = path / TRANSFER_FILE
    try:
        return TransferInfo.model_validate_json(file.read_bytes())
    except (OSError, ValidationError) as e:
        raise ValueError(f"{file} is not a readable weight-transfer file: {e}") from None
