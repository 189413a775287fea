"""The GPU configs resolve on a machine without GPUs: `rl --dry-run` places every role on its
devices and prints the commands, touching no CUDA (what CI can check of them)."""

import tomllib
from pathlib import Path

import pytest

from envrl.launcher.main import main

TINY_MODEL = Path(__file__).resolve().parents[3] / "deps" / "models" / "tiny-chat"
GPU_CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs" / "gpu").glob("*.toml"))


@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda p: p.stem)
def test_gpu_config_dry_run_places_every_role_without_cuda(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        # The configs' Qwen3-0.6B-shaped model is built on the GPU box (docs/gpu.md); placement is what is checked here.
        teacher = ["--orchestrator.distill.teacher-weights", str(TINY_MODEL)] if "distill" in config.stem else []
        main(["--config", str(config), "--model.name", str(TINY_MODEL), *teacher, "--dry-run"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    commands = capsys.readouterr().out.split("# commands")[1].splitlines()[1:]
    devices: dict[str, list[str]] = {}  # each role's devices, over its processes (inference replicas)
    for line in commands:
        if line.startswith("#"):
            continue
        if "configs/teacher.toml" in line:  # the teacher's server runs envrl.inference.main too
            role = "teacher"
        elif "envrl.inference.main" in line:
            role = "inference"
        elif "envrl.trainer.main" in line or "torchrun" in line:
            role = "trainer"
        else:
            continue
        devices.setdefault(role, []).extend(line.split()[0].removeprefix("CUDA_VISIBLE_DEVICES=").split(","))
    declared = tomllib.loads(config.read_text())["placement"]
    expected = {
        role: [str(g) for g in declared[role]["gpus"]]
        for role in ("inference", "trainer", "teacher")
        if role in declared
    }
    assert devices == expected, commands
    import torch

    assert not torch.cuda.is_initialized()


def test_there_are_gpu_configs_to_check() -> None:
    assert {p.stem for p in GPU_CONFIGS} >= {"one_gpu", "two_gpus", "two_nodes", "distill_two_gpus"}
