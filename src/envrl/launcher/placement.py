"""Which devices each role of a run gets, and how many trainer ranks there are.

Guarantee: a `Placement` from `place` only names devices that exist as far as `rl` can tell
(non-negative ids, none twice in a list, each below the number of GPUs `rl` sees when it can
count them); the trainer has one rank per device of `trainer.gpus` (else `trainer.num_procs`
gloo ranks on CPU); inference and trainer share no device unless their lists are identical,
which is the explicit way to share (one GPU for both). Anything else is a one-line
`ConfigError` naming the keys.

Device ids count the GPUs `rl` itself sees: under `CUDA_VISIBLE_DEVICES=4,5`, `gpus = [1]`
starts the process with `CUDA_VISIBLE_DEVICES=5`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig
from envrl.trainer.config import TrainerConfig

NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")
"""One entry per GPU the NVIDIA driver knows (absent without the driver)."""
VLLM_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
"""vLLM options whose product is the number of devices one server uses."""


class Placement(BaseModel):
    """Devices per role (empty: the process sees what `rl` sees) and the trainer's rank count."""

    trainer_ranks: int
    trainer_gpus: list[int]
    inference_gpus: list[list[int]]
    """Each inference replica's devices (its slice of `inference.gpus`)."""
    visible: list[str] | None
    """The GPUs `rl` sees (its own CUDA_VISIBLE_DEVICES entries, else one per driver GPU), None if unknown."""

    def trainer_env(self) -> dict[str, str]:
        return cuda_env(self.trainer_gpus, self.visible)

    def inference_env(self, replica: int = 0) -> dict[str, str]:
        return cuda_env(self.inference_gpus[replica], self.visible)


def visible_gpus(environ: Mapping[str, str] = os.environ, driver_dir: Path = NVIDIA_GPUS_DIR) -> list[str] | None:
    """The GPUs `rl` may hand out: its own CUDA_VISIBLE_DEVICES, else every GPU of the driver, else None."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    if driver_dir.is_dir():
        return [str(i) for i in range(len(list(driver_dir.iterdir())))]
    return None


def cuda_env(gpus: Sequence[int], visible: Sequence[str] | None) -> dict[str, str]:
    """The CUDA_VISIBLE_DEVICES that shows a process exactly `gpus` (nothing when `gpus` is empty)."""
    if not gpus:
        return {}
    names = [visible[i] if visible is not None else str(i) for i in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(names)}


def place(
    trainer: TrainerConfig, inference: InferenceConfig, visible: list[str] | None, replicas: int = 1
) -> Placement:
    """Check the device lists of both roles against each other and this machine (module docstring);
    with `replicas` inference servers, each gets its slice of `inference.gpus` (`replica_gpus`)."""
    for key, gpus in (("trainer.gpus", trainer.gpus), ("inference.gpus", inference.gpus)):
        _check_device_list(key, gpus, visible)
    shared = sorted(set(trainer.gpus) & set(inference.gpus))
    if shared and sorted(trainer.gpus) != sorted(inference.gpus):
        raise ConfigError(
            f"trainer.gpus {trainer.gpus} and inference.gpus {inference.gpus} overlap on {shared}: give each role "
            "its own devices, or the same list to both to share them (then lower inference.vllm.gpu_memory_utilization)"
        )
    ranks = trainer.num_procs or max(1, len(trainer.gpus))
    if trainer.gpus and ranks != len(trainer.gpus):
        raise ConfigError(
            f"trainer.num_procs = {trainer.num_procs} but trainer.gpus lists {len(trainer.gpus)} device(s): "
            "with gpus the trainer runs one rank per device; drop trainer.num_procs or list one device per rank"
        )
    slices = replica_gpus(inference.gpus, replicas)
    _check_vllm_fits(inference, slices[0])
    return Placement(trainer_ranks=ranks, trainer_gpus=trainer.gpus, inference_gpus=slices, visible=visible)


def replica_gpus(gpus: Sequence[int], replicas: int) -> list[list[int]]:
    """Replica i's devices: the i-th of `replicas` equal consecutive slices of `gpus` ([] each when none are listed)."""
    if replicas < 1:
        raise ConfigError(f"inference.replicas = {replicas}: start at least one inference server")
    if not gpus:
        return [[] for _ in range(replicas)]
    if len(gpus) % replicas:
        raise ConfigError(
            f"inference.gpus lists {len(gpus)} device(s), which do not split evenly into inference.replicas = "
            f"{replicas}: list a multiple of {replicas} devices"
        )
    size = len(gpus) // replicas
    return [list(gpus[i * size : (i + 1) * size]) for i in range(replicas)]


def _check_device_list(key: str, gpus: Sequence[int], visible: Sequence[str] | None) -> None:
    negative = [g for g in gpus if g < 0]
    if negative:
        raise ConfigError(f"{key} = {list(gpus)} has negative device ids {negative}: ids count from 0")
    twice = sorted({g for g in gpus if list(gpus).count(g) > 1})
    if twice:
        raise ConfigError(f"{key} = {list(gpus)} lists devices {twice} more than once: list each device once")
    if visible is not None:
        missing = [g for g in gpus if g >= len(visible)]
        if missing:
            raise ConfigError(
                f"{key} = {list(gpus)} names devices {missing}, but rl sees {len(visible)} GPU(s) "
                f"({','.join(visible) or 'none'}; from CUDA_VISIBLE_DEVICES or the NVIDIA driver): use ids 0-{len(visible) - 1}"
                if visible
                else f"{key} = {list(gpus)}, but rl sees no GPU (CUDA_VISIBLE_DEVICES is empty): unset it or drop {key}"
            )


def _check_vllm_fits(inference: InferenceConfig, gpus: Sequence[int]) -> None:
    """One vLLM server cannot run more parallel ranks than it has devices (`gpus`, its slice)."""
    if not gpus:
        return
    need = 1
    for key in VLLM_PARALLEL_KEYS:
        value = inference.vllm.get(key, inference.vllm.get(key.replace("_", "-"), 1))
        need *= int(value)
    if need > len(gpus):
        sizes = ", ".join(
            f"{k} = {inference.vllm[k]}" for k in inference.vllm if k.replace("-", "_") in VLLM_PARALLEL_KEYS
        )
        raise ConfigError(
            f"inference.vllm ({sizes}) needs {need} devices per server but it gets {len(gpus)} of inference.gpus: "
            "list more devices or lower the parallel sizes"
        )
