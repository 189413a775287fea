"""Two torchrun ranks (gloo, CPU) build the model on the meta device and read only their own
shards from the safetensors files: every parameter is a Shard(0) DTensor equal to the file's
rows, the tied head and rotary buffers are right, and no rank held the whole model.

The model is big enough (~270 MB in fp32) that the memory check has a wide margin: a rank that
loads the whole model grows by at least its fp32 size, one that loads its shard by half of it
plus one read chunk (16 MB) and allocator slack (tens of MB).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.support.commands import run_to_completion

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT_S = 240
SHAPE = {
    "vocab_size": 16384,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
"""Qwen3's architecture at ~67M parameters, its tied embedding a quarter of them like 0.6B's."""
GROWTH_SHARE = 0.8
"""A rank's peak memory growth over the load, as a share of the full fp32 model: its half plus slack."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-67m")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SHAPE)).to(torch.bfloat16).save_pretrained(out)
    return out


@dataclass(frozen=True)
class Loaded:
    out: Path
    code: int
    output: str


@pytest.fixture(scope="module")
def loaded(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    """One torchrun of 2 ranks for the module: each rank loads the model, writes its report, then
    loads it again with LoRA adapters and writes that report too (`--then-lora`: each rank imports
    torch and transformers once for both loads)."""
    out = tmp_path_factory.mktemp("loaded")
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "tests.support.sharded_load"]
    proc = run_to_completion([*command, str(model_dir), str(out), "--then-lora"], TIMEOUT_S)
    return Loaded(out, proc.returncode, proc.stdout)


def reports(loaded: Loaded, suffix: str) -> list[dict]:
    """Each rank's report of one load (`suffix` "" for the plain load, "-lora" for the LoRA one)."""
    files = [loaded.out / f"rank{rank}{suffix}.json" for rank in range(2)]
    assert all(f.is_file() for f in files), loaded.output
    return [json.loads(f.read_text()) for f in files]


def test_each_rank_loads_only_its_shards_from_the_files(loaded: Loaded) -> None:
    """The plain load (reported before the LoRA load starts): Shard(0) DTensors equal to the
    file's rows, tied head and rotary right, and each rank grew by about its half, not the whole."""
    for report in reports(loaded, ""):
        assert report["failed"] == [], report
        assert report["shard_bytes"] < 0.51 * report["full_bytes"], report
        assert report["growth_bytes"] < GROWTH_SHARE * report["full_bytes"], report


def test_lora_adapters_on_sharded_ranks_start_as_peft_starts_them(loaded: Loaded) -> None:
    """The LoRA load: the same checks of the base weights, and every adapter as peft starts it
    (B zero, A drawn); the run exited 0."""
    assert loaded.code == 0, loaded.output
    for report in reports(loaded, "-lora"):
        assert report["failed"] == [], report
