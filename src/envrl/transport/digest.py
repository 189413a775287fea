"""A policy's digest (sha256 over its tensors' names, dtypes, shapes and bytes, in a fixed order),
which the trainer publishes and every replica recomputes from what it loads; a mismatch is a
`WeightsError` naming the policy (docs/scale.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from envrl.transport.files import WeightsError

if TYPE_CHECKING:
    import torch

DIGEST_FILE = "policy.sha256"
"""In a policy written as files: the digest of its tensors in name order, as the trainer had them."""


class PolicyDigest:
    """A digest fed one tensor at a time (CPU tensors; others are copied to the CPU)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        import torch

        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        self._hash.update(f"{name}|{str(flat.dtype).removeprefix('torch.')}|{list(tensor.shape)}\n".encode())
        self._hash.update(flat.view(torch.uint8).numpy().data)

    def add_bytes(self, name: str, dtype_name: str, shape: list[int], data: torch.Tensor) -> None:
        """A tensor that travels as its raw bytes (`data`, uint8), as the memory transport sends it."""
        self._hash.update(f"{name}|{dtype_name}|{list(shape)}\n".encode())
        self._hash.update(data.numpy().data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def digest_of(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    digest = PolicyDigest()
    for name, tensor in named:
        digest.add(name, tensor)
    return digest.hexdigest()


def policy_digest(path: Path, state: Mapping[str, torch.Tensor] | None = None) -> str:
    """The digest of the tensors in `path`/*.safetensors, in name order: each taken from `state`
    (the trainer's, as it wrote them) where it has that name, else as read from the file (a
    replica; a tied tensor the trainer's state names otherwise)."""
    from safetensors import safe_open

    handles = [safe_open(str(file), framework="pt") for file in sorted(path.glob("*.safetensors"))]
    where = {name: handle for handle in handles for name in handle.keys()}  # noqa: SIM118 (safe_open is not a dict)
    state = state or {}
    return digest_of((name, state[name] if name in state else where[name].get_tensor(name)) for name in sorted(where))


def check_files_digest(path: Path) -> None:
    """WeightsError unless the tensors in `path` hash to the digest the trainer wrote there (a
    directory without one, e.g. the base model, is not checked)."""
    file = path / DIGEST_FILE
    if not file.is_file():
        return
    want, got = file.read_text().strip(), policy_digest(path)
    if got != want:
        raise WeightsError(
            f"the policy in {path} is not what the trainer published: its tensors hash to {got[:16]}..., the "
            f"trainer's digest ({DIGEST_FILE}) is {want[:16]}...: the files were changed or damaged after they "
            "were written (a filesystem the hosts do not see alike?)"
        )
