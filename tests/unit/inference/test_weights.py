"""A weights directory is accepted for reload only if it matches the served checkpoint exactly."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from envrl.inference.weights import WeightsError, check_replacement, read_shapes

SERVED = {"embed.weight": (10, 4), "layer.weight": (4, 4), "norm.weight": (4,)}


def write(directory: Path, shapes: dict[str, tuple[int, ...]], files: int = 1) -> Path:
    directory.mkdir(parents=True)
    names = sorted(shapes)
    for i in range(files):
        part = {name: torch.zeros(shapes[name]) for name in names[i::files]}
        save_file(part, directory / f"model-{i}.safetensors")
    return directory


def test_matching_sharded_checkpoint_is_accepted(tmp_path: Path) -> None:
    new = write(tmp_path / "step_1", SERVED, files=2)
    assert read_shapes(new) == SERVED
    check_replacement(new, SERVED)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="step_9 does not exist"):
        check_replacement(tmp_path / "step_9", SERVED)


def test_directory_without_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(WeightsError, match=r"no \*\.safetensors files"):
        check_replacement(tmp_path / "step_1", SERVED)


def test_corrupt_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(WeightsError, match="model.safetensors is not a readable safetensors file"):
        check_replacement(tmp_path / "step_1", SERVED)


def test_shape_mismatch_and_missing_and_extra_tensors_are_all_named(tmp_path: Path) -> None:
    new = write(tmp_path / "step_1", {"embed.weight": (11, 4), "layer.weight": (4, 4), "extra.bias": (4,)})
    with pytest.raises(WeightsError) as refused:
        check_replacement(new, SERVED)
    message = str(refused.value)
    assert "missing tensors norm.weight" in message
    assert "unexpected tensors extra.bias" in message
    assert "shape mismatch: embed.weight [11, 4] (served: [10, 4])" in message
