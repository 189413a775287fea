"""Placement: device lists per role become each process's CUDA_VISIBLE_DEVICES and the trainer's
rank count, and impossible layouts are one-line errors naming the keys."""

from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.plan.placement import (
    InferencePlacement,
    Placement,
    PlacementConfig,
    TeacherPlacement,
    TrainerPlacement,
    place,
    replica_gpus,
    visible_gpus,
)


def placement(
    trainer: dict | None = None,
    inference: dict | None = None,
    visible: list[str] | None = None,
    replicas: int = 1,
    teacher: dict | None = None,
    apart: set[frozenset[str]] | None = None,
) -> Placement:
    """`[placement]` with these `trainer`, `inference` and `teacher` keys (`inference["vllm"]`: the servers' options)."""
    inference = dict(inference or {})
    vllm = inference.pop("vllm", {})
    config = PlacementConfig(
        trainer=TrainerPlacement(**(trainer or {})),
        inference=InferencePlacement(**inference, replicas=replicas),
        teacher=TeacherPlacement(**(teacher or {})),
    )
    return place(config, vllm, visible, apart or set())


def test_without_device_lists_every_process_sees_what_rl_sees() -> None:
    p = placement(visible=["0", "1"])
    assert (p.trainer_ranks, p.trainer_env(), p.inference_env()) == (1, {}, {})


def test_each_role_sees_only_its_devices_and_the_trainer_runs_one_rank_per_device() -> None:
    p = placement({"gpus": [2, 3]}, {"gpus": [0, 1]}, visible=["0", "1", "2", "3"])
    assert p.trainer_ranks == 2
    assert p.trainer_env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert p.inference_env() == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_device_ids_count_the_gpus_rl_itself_sees() -> None:
    p = placement({"gpus": [1]}, {"gpus": [0]}, visible=["GPU-a", "GPU-b"])
    assert p.trainer_env() == {"CUDA_VISIBLE_DEVICES": "GPU-b"}
    assert p.inference_env() == {"CUDA_VISIBLE_DEVICES": "GPU-a"}


def test_identical_lists_share_the_devices() -> None:
    p = placement({"gpus": [0]}, {"gpus": [0]}, visible=["0"])
    assert p.trainer_env() == p.inference_env() == {"CUDA_VISIBLE_DEVICES": "0"}


def test_num_procs_sets_cpu_ranks() -> None:
    assert placement({"num_procs": 2}).trainer_ranks == 2


@pytest.mark.parametrize(
    ("trainer", "inference", "visible", "message"),
    [
        (
            {"gpus": [0, 1]},
            {"gpus": [1, 2]},
            None,
            r"placement.trainer.gpus \[0, 1\] and placement.inference.gpus \[1, 2\] overlap on \[1\]",
        ),
        ({"gpus": [-1]}, {}, None, r"placement.trainer.gpus = \[-1\] has negative device ids \[-1\]"),
        ({}, {"gpus": [0, 0]}, None, r"placement.inference.gpus = \[0, 0\] lists devices \[0\] more than once"),
        (
            {"gpus": [0, 2]},
            {},
            ["0", "1"],
            r"placement.trainer.gpus = \[0, 2\] names devices \[2\], but rl sees 2 GPU\(s\)",
        ),
        ({"gpus": [0]}, {}, [], r"placement.trainer.gpus = \[0\], but rl sees no GPU"),
        (
            {"gpus": [0, 1], "num_procs": 3},
            {},
            None,
            r"placement.trainer.num_procs = 3 but placement.trainer.gpus lists 2 device\(s\)",
        ),
        (
            {},
            {"gpus": [0], "vllm": {"tensor_parallel_size": 2}},
            None,
            r"inference.vllm \(tensor_parallel_size = 2\) needs 2 devices per server but it gets 1",
        ),
    ],
)
def test_impossible_layouts_are_errors_naming_the_keys(
    trainer: dict, inference: dict, visible: list[str] | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        placement(trainer, inference, visible)


def test_num_procs_below_one_is_rejected_at_load() -> None:
    with pytest.raises(ConfigError, match="num_procs"):
        resolve_config(PlacementConfig, overrides=[("trainer.num-procs", "0")])


def test_replicas_get_equal_consecutive_slices_of_the_inference_devices() -> None:
    assert replica_gpus([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert replica_gpus([], 3) == [[], [], []]
    with pytest.raises(ConfigError, match=r"placement.inference.gpus lists 3 device\(s\), which do not split evenly"):
        replica_gpus([0, 1, 2], 2)


def test_parallel_sizes_are_checked_against_one_replicas_slice() -> None:
    inference = {"gpus": [0, 1, 2, 3], "vllm": {"tensor_parallel_size": 2}}
    placement({}, inference, replicas=2)
    with pytest.raises(ConfigError, match="needs 2 devices per server but it gets 1"):
        placement({}, inference, replicas=4)


def test_rl_sees_its_own_visible_devices_else_the_drivers(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, tmp_path / "absent") == ["3", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpus({}, tmp_path) == ["0", "1"]
    assert visible_gpus({}, tmp_path / "absent") is None


def test_each_inference_replica_sees_only_its_slice_of_the_devices() -> None:
    p = placement({"gpus": [2]}, {"gpus": [0, 1]}, ["0", "1", "2"], replicas=2)
    assert [p.inference_env(0), p.inference_env(1)] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]


def test_roles_on_different_hosts_may_list_the_same_devices_and_the_teacher_gets_its_own() -> None:
    """In a job the trainer's host is not the inference host: their lists number different GPUs."""
    with pytest.raises(ConfigError, match="overlap"):
        placement({"gpus": [0, 1, 2, 3]}, {"gpus": [0, 1]}, teacher={"gpus": [2]})
    p = placement(
        {"gpus": [0, 1, 2, 3]},
        {"gpus": [0, 1]},
        teacher={"gpus": [2]},
        apart={frozenset(("trainer", "inference")), frozenset(("trainer", "teacher"))},
    )
    assert (p.trainer_env(), p.inference_env(), p.teacher_env()) == (
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "2"},
    )


@pytest.mark.parametrize(
    ("teacher", "message"),
    [
        ({"gpus": [1, 2]}, r"placement.trainer.gpus \[0, 1\] and placement.teacher.gpus \[1, 2\] overlap on \[1\]"),
        ({"gpus": [3, 3]}, r"placement.teacher.gpus = \[3, 3\] lists devices \[3\] more than once"),
    ],
)
def test_a_teacher_list_is_checked_like_the_others(teacher: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        placement({"gpus": [0, 1]}, {"gpus": [4]}, teacher=teacher)


def test_the_teacher_list_must_hold_the_servers_parallel_sizes() -> None:
    inference = {"gpus": [0, 1], "vllm": {"tensor_parallel_size": 2}}
    with pytest.raises(ConfigError, match=r"needs 2 devices per server but it gets 1 \(placement.teacher.gpus\)"):
        placement({}, inference, teacher={"gpus": [2]})
