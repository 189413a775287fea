"""Which devices each role gets: a `Placement` names only devices `rl` sees, one trainer rank per trainer device,
and no two roles on one host share a device unless their lists are identical; anything else is a one-line
`ConfigError`."""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from envrl.config import BaseConfig, ConfigError

NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")
"""One entry per GPU the NVIDIA driver knows (absent without the driver)."""
VLLM_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
"""vLLM options whose product is the number of devices one server uses."""


class TrainerPlacement(BaseConfig):
    """`[placement.trainer]`: the trainer's devices and ranks."""

    gpus: list[int] = []
    """Devices of the trainer, counted among the GPUs `rl` sees; `rl` starts one rank per device
    (under torchrun when more than one), with CUDA_VISIBLE_DEVICES set to them. Empty: the trainer
    sees what `rl` sees. Must not overlap `placement.inference.gpus` unless both lists are the same
    (shared)."""
    num_procs: int | None = Field(None, ge=1)
    """Trainer ranks: more than one starts the trainer under torchrun (gloo on CPU). Default:
    len(gpus), or 1 without gpus; with gpus it must equal len(gpus)."""


class InferencePlacement(BaseConfig):
    """`[placement.inference]`: how many vLLM servers `rl` starts, and their devices."""

    gpus: list[int] = []
    """Devices of the inference servers, counted among the GPUs `rl` sees: each is started with
    CUDA_VISIBLE_DEVICES set to its slice (`replicas` equal slices). Empty: each sees what `rl`
    sees. Must not overlap `placement.trainer.gpus` unless both lists are the same (one GPU shared)."""
    replicas: int = Field(1, ge=1)
    """vLLM servers `rl` starts, each with the same options (`inference.vllm`: tensor/data
    parallelism are vLLM's own, per replica) on ports `inference.port` .. `inference.port +
    replicas - 1`; env servers spread model calls across them and every step's weights are loaded
    on all. The `inference` command serves one: start one per replica (docs/scale.md)."""


class TeacherPlacement(BaseConfig):
    """`[placement.teacher]`: the devices of the distillation teacher's vLLM server, which `rl`
    starts for `orchestrator.distill.teacher_weights`."""

    gpus: list[int] = []
    """Devices of the teacher's server, counted among the GPUs `rl` sees (under `--slurm`: of the
    first inference host, where it runs). Empty: it sees what `rl` sees, which a run that lists
    any role's devices (and every `--slurm` job) refuses. Its own devices, or the same list as
    `placement.inference.gpus` (two vLLM servers on those devices: then
    `inference.vllm.gpu_memory_utilization` at most 0.45, which both take). It runs with the
    run's `inference.vllm` options, so their parallel sizes must fit the list."""


class PlacementConfig(BaseConfig):
    """`[placement]`: which devices each role of `rl`'s run gets and how many of each it starts
    (`rl --slurm`: on each host of `[slurm]`). The launcher's own keys: no process reads them."""

    trainer: TrainerPlacement = TrainerPlacement()
    inference: InferencePlacement = InferencePlacement()
    teacher: TeacherPlacement = TeacherPlacement()


class Placement(BaseModel):
    """Devices per role (empty: the process sees what `rl` sees) and the trainer's rank count."""

    trainer_ranks: int
    trainer_gpus: list[int]
    inference_gpus: list[list[int]]
    """Each inference replica's devices (its slice of `inference.gpus`)."""
    teacher_gpus: list[int] = []
    """The distillation teacher's server's devices."""
    visible: list[str] | None
    """The GPUs `rl` sees (its own CUDA_VISIBLE_DEVICES entries, else one per driver GPU), None if unknown."""

    def trainer_env(self) -> dict[str, str]:
        return cuda_env(self.trainer_gpus, self.visible)

    def inference_env(self, replica: int = 0) -> dict[str, str]:
        return cuda_env(self.inference_gpus[replica], self.visible)

    def teacher_env(self) -> dict[str, str]:
        return cuda_env(self.teacher_gpus, self.visible)

    @property
    def teacher_shares_inference(self) -> bool:
        """Whether the teacher's server runs on the inference servers' devices (the same list)."""
        return bool(self.teacher_gpus) and sorted(self.teacher_gpus) == sorted(
            g for s in self.inference_gpus for g in s
        )


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


ROLE_KEYS = {
    "trainer": "placement.trainer.gpus",
    "inference": "placement.inference.gpus",
    "teacher": "placement.teacher.gpus",
}
"""Each role's device list, by the name `place` knows it under."""


def place(
    config: PlacementConfig,
    vllm: dict[str, Any],
    visible: list[str] | None,
    apart: Collection[frozenset[str]] = (),
) -> Placement:
    """Check the device lists of the roles against each other and this machine (module docstring);
    each of the `replicas` inference servers gets its slice of their `gpus` (`replica_gpus`), which
    must hold the parallel sizes of the servers' `vllm` options, as the teacher's list must.
    `apart` names pairs of roles (`ROLE_KEYS`) that run on different hosts, whose lists may overlap."""
    trainer, inference, teacher = config.trainer, config.inference, config.teacher
    lists = {"trainer": trainer.gpus, "inference": inference.gpus, "teacher": teacher.gpus}
    for role, gpus in lists.items():
        _check_device_list(ROLE_KEYS[role], gpus, visible)
    for (a, gpus_a), (b, gpus_b) in itertools.combinations(lists.items(), 2):
        shared = sorted(set(gpus_a) & set(gpus_b))
        if shared and sorted(gpus_a) != sorted(gpus_b) and frozenset((a, b)) not in apart:
            raise ConfigError(
                f"{ROLE_KEYS[a]} {gpus_a} and {ROLE_KEYS[b]} {gpus_b} overlap on {shared}: give each role its own "
                "devices, or the same list to both to share them (then lower inference.vllm.gpu_memory_utilization)"
            )
    ranks = trainer.num_procs or max(1, len(trainer.gpus))
    if trainer.gpus and ranks != len(trainer.gpus):
        raise ConfigError(
            f"placement.trainer.num_procs = {trainer.num_procs} but placement.trainer.gpus lists "
            f"{len(trainer.gpus)} device(s): with gpus the trainer runs one rank per device; drop num_procs or "
            "list one device per rank"
        )
    slices = replica_gpus(inference.gpus, inference.replicas)
    _check_vllm_fits(vllm, slices[0], "one replica's slice of placement.inference.gpus")
    _check_vllm_fits(vllm, teacher.gpus, "placement.teacher.gpus")
    return Placement(
        trainer_ranks=ranks,
        trainer_gpus=trainer.gpus,
        inference_gpus=slices,
        teacher_gpus=teacher.gpus,
        visible=visible,
    )


def replica_gpus(gpus: Sequence[int], replicas: int) -> list[list[int]]:
    """Replica i's devices: the i-th of `replicas` equal consecutive slices of `gpus` ([] each when none are listed)."""
    if replicas < 1:
        raise ConfigError(f"placement.inference.replicas = {replicas}: start at least one inference server")
    if not gpus:
        return [[] for _ in range(replicas)]
    if len(gpus) % replicas:
        raise ConfigError(
            f"placement.inference.gpus lists {len(gpus)} device(s), which do not split evenly into "
            f"placement.inference.replicas = {replicas}: list a multiple of {replicas} devices"
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


def _check_vllm_fits(vllm: dict[str, Any], gpus: Sequence[int], what: str) -> None:
    """One vLLM server cannot run more parallel ranks than it has devices (`gpus`: `what`)."""
    if not gpus:
        return
    need = 1
    for key in VLLM_PARALLEL_KEYS:
        value = vllm.get(key, vllm.get(key.replace("_", "-"), 1))
        need *= int(value)
    if need > len(gpus):
        sizes = ", ".join(f"{k} = {vllm[k]}" for k in vllm if k.replace("-", "_") in VLLM_PARALLEL_KEYS)
        raise ConfigError(
            f"inference.vllm ({sizes}) needs {need} devices per server but it gets {len(gpus)} ({what}): "
            "list more devices or lower the parallel sizes"
        )
