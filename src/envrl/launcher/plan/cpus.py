"""With `pin = true` on a CPU build of vLLM with two or more cores, vLLM and the trainer compute on disjoint cores;
otherwise nothing is pinned, and the trainer beside a generating vLLM-CPU runs one thread (why: docs/running.md)."""

from __future__ import annotations

import importlib.metadata
import os

from pydantic import BaseModel, Field, model_validator

from envrl.config import BaseConfig, ConfigError


class CpusConfig(BaseConfig):
    """`[cpus]`: cores of the inference server and the trainer on a machine without GPUs."""

    pin: bool = False
    """Give inference and trainer their own cores (CPU builds of vLLM only). Off by default: on a
    small box each role then loses the other's idle core (measurements: docs/running.md)."""
    inference: list[int] | None = Field(None, min_length=1)
    """Cores of vLLM's CPU worker. Default: the cores the trainer does not get (without either
    list: the first half of the cores `rl` may use, rounded up)."""
    trainer: list[int] | None = Field(None, min_length=1)
    """Cores of the trainer (its affinity and its torch threads). Default: the other cores."""

    @model_validator(mode="after")
    def _disjoint(self) -> CpusConfig:
        shared = set(self.inference or ()) & set(self.trainer or ())
        if shared:
            raise ValueError(f"cpus.inference and cpus.trainer share cores {sorted(shared)}: give each its own")
        return self


class CoreSplit(BaseModel):
    """The cores each compute process gets, and what that means for its environment."""

    inference: list[int]
    trainer: list[int]

    def inference_env(self) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.inference))}

    def trainer_env(self) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(len(self.trainer))}


def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the `vllm-cpu` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def split_cores(config: CpusConfig, available: set[int], cpu_build: bool) -> CoreSplit | None:
    """The split of `available` cores for this run, or None when nothing should be pinned."""
    if not config.pin or not cpu_build:
        return None
    for key, cores in (("inference", config.inference), ("trainer", config.trainer)):
        missing = sorted(set(cores or ()) - available)
        if missing:
            raise ConfigError(
                f"cpus.{key} names cores {missing} this process may not use (usable: {sorted(available)}); "
                "fix the list or set cpus.pin = false"
            )
    cores = sorted(available)
    if len(cores) < 2 and not (config.inference and config.trainer):
        return None
    if config.inference is None and config.trainer is None:
        inference = cores[: (len(cores) + 1) // 2]
    else:
        inference = config.inference or [c for c in cores if c not in (config.trainer or ())]
    trainer = config.trainer or [c for c in cores if c not in inference]
    if not inference or not trainer:
        raise ConfigError(
            f"cpus: no cores left for {'inference' if not inference else 'the trainer'} "
            f"(usable: {cores}); give both lists or set cpus.pin = false"
        )
    return CoreSplit(inference=inference, trainer=trainer)


def trainer_env(
    split: CoreSplit | None,
    cpu_build: bool,
    max_async_level: int,
    cores: int | None = None,
    omp_set: bool | None = None,
) -> dict[str, str]:
    """What the trainer's environment gets: the split's threads when pinned; unpinned beside vLLM-CPU
    (unless OMP_NUM_THREADS is set), one torch thread when it trains while vLLM generates, and
    on-policy all `cores` (default: the usable ones) but one, as vLLM leaves one to the others.

    Why: vLLM binds its threads to every core but one, and a torch thread on one of those stalls
    both (each parallel region waits for its slowest thread). On-policy the trainer does not
    train alone either: env workers, the orchestrator and vLLM's API server run beside it, so a
    second thread gains little on a quiet box and loses much beside another job
    (docs/measurements.md). `cores` and `omp_set` (OMP_NUM_THREADS is set) default to this process's."""
    if split is not None:
        return split.trainer_env()
    if omp_set is None:
        omp_set = "OMP_NUM_THREADS" in os.environ
    if not cpu_build or omp_set:
        return {}
    threads = 1 if max_async_level >= 1 else max(1, (len(usable_cores()) if cores is None else cores) - 1)
    return {"OMP_NUM_THREADS": str(threads)}


def usable_cores() -> set[int]:
    """The cores this process (and so its children) may run on."""
    return set(os.sched_getaffinity(0))


def pin(pid: int, cores: list[int]) -> None:
    """Restrict process `pid` to `cores` (its threads started later inherit the restriction)."""
    os.sched_setaffinity(pid, cores)
