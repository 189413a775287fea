"""Which cores inference and trainer get: the split, the lists users give, and the refusals."""

from __future__ import annotations

import pytest

from envrl.config import ConfigError
from envrl.launcher.plan.cpus import CoreSplit, CpusConfig, split_cores, trainer_env


def test_cores_are_split_in_halves_inference_first() -> None:
    assert split_cores(CpusConfig(pin=True), {0, 1}, cpu_build=True) == CoreSplit(inference=[0], trainer=[1])
    assert split_cores(CpusConfig(pin=True), set(range(5)), cpu_build=True) == CoreSplit(
        inference=[0, 1, 2], trainer=[3, 4]
    )


def test_one_list_given_leaves_the_other_role_the_rest() -> None:
    assert split_cores(CpusConfig(pin=True, trainer=[0]), {0, 1, 2}, cpu_build=True) == CoreSplit(
        inference=[1, 2], trainer=[0]
    )
    assert split_cores(CpusConfig(pin=True, inference=[2]), {0, 1, 2}, cpu_build=True) == CoreSplit(
        inference=[2], trainer=[0, 1]
    )


def test_nothing_is_pinned_by_default_on_gpu_builds_or_single_cores() -> None:
    assert split_cores(CpusConfig(), {0, 1}, cpu_build=True) is None
    assert split_cores(CpusConfig(pin=True), {0, 1}, cpu_build=False) is None
    assert split_cores(CpusConfig(pin=True), {0}, cpu_build=True) is None


def test_the_plan_becomes_each_process_environment() -> None:
    plan = CoreSplit(inference=[0, 1], trainer=[2, 3, 4])
    assert plan.inference_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}
    assert plan.trainer_env() == {"OMP_NUM_THREADS": "3"}


def test_overlapping_unknown_or_exhausted_cores_are_config_errors() -> None:
    with pytest.raises(ValueError, match=r"share cores \[1\]"):
        CpusConfig(inference=[0, 1], trainer=[1])
    with pytest.raises(ConfigError, match=r"cpus.trainer names cores \[7\]"):
        split_cores(CpusConfig(pin=True, trainer=[7]), {0, 1}, cpu_build=True)
    with pytest.raises(ConfigError, match="no cores left for the trainer"):
        split_cores(CpusConfig(pin=True, inference=[0, 1]), {0, 1}, cpu_build=True)


def test_an_unpinned_trainer_beside_cpu_generation_leaves_vllm_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert trainer_env(None, cpu_build=True, max_async_level=1, cores=16) == {"OMP_NUM_THREADS": "1"}
    # on-policy: every core but the one vLLM also leaves to the env workers, orchestrator and API server
    assert trainer_env(None, cpu_build=True, max_async_level=0, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert trainer_env(None, cpu_build=True, max_async_level=0, cores=16) == {"OMP_NUM_THREADS": "15"}
    assert trainer_env(None, cpu_build=True, max_async_level=0, cores=1) == {"OMP_NUM_THREADS": "1"}
    assert trainer_env(None, cpu_build=False, max_async_level=2) == {}
    assert trainer_env(CoreSplit(inference=[0], trainer=[1, 2]), cpu_build=True, max_async_level=2) == {
        "OMP_NUM_THREADS": "2"
    }
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert trainer_env(None, cpu_build=True, max_async_level=1) == {}  # the user's choice stands
