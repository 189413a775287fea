"""A weights directory is accepted for reload only if it matches the served checkpoint exactly,
read once into a `WeightSource` that says how the policy travels."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from envrl.transport.files import WeightsError, check_shapes, read_shapes
from envrl.transport.source import AdapterWeights, FileWeights, MemoryWeights, read_source

SERVED = {"embed.weight": (10, 4), "layer.weight": (4, 4), "norm.weight": (4,)}


def write(directory: Path, shapes: dict[str, tuple[int, ...]], files: int = 1) -> Path:
    directory.mkdir(parents=True)
    names = sorted(shapes)
    for i in range(files):
        part = {name: torch.zeros(shapes[name]) for name in names[i::files]}
        save_file(part, directory / f"model-{i}.safetensors")
    return directory


def check_replacement(directory: Path, served: dict[str, tuple[int, ...]]) -> None:
    """What a replica checks before a reload: the directory read once, then its shapes."""
    source = read_source(directory)
    assert isinstance(source, FileWeights)
    check_shapes(source.shapes, served, str(directory))


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


def test_a_directory_is_read_once_into_what_its_transport_needs(tmp_path: Path) -> None:
    files = read_source(write(tmp_path / "step_1", SERVED), step=1)
    assert files == FileWeights(tmp_path / "step_1", SERVED, 1)
    adapter = tmp_path / "step_2"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    assert read_source(adapter) == AdapterWeights(adapter, 8)
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(WeightsError, match="adapter_config.json is not a readable PEFT adapter config"):
        read_source(adapter)
    memory = tmp_path / "step_3"
    memory.mkdir()
    (memory / "transfer.json").write_text("{}")
    with pytest.raises(WeightsError, match="transfer.json is not a readable weight-transfer file"):
        read_source(memory)
    info = (
        '{"step": 3, "backend": "gloo", "host": "127.0.0.1", "port": 1, "names": [], "dtype_names": [], "shapes": []}'
    )
    (memory / "transfer.json").write_text(info)
    source = read_source(memory, step=3)
    assert isinstance(source, MemoryWeights) and source.info.port == 1 and source.step == 3
