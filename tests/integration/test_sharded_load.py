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


def load_on_two_ranks(model_dir: Path, out: Path, *flags: str) -> list[dict]:
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "tests.support.sharded_load"]
    proc = run_to_completion([*command, str(model_dir), str(out), *flags], TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_each_rank_loads_only_its_shards_from_the_files(model_dir: Path, tmp_path: Path) -> None:
    for report in load_on_two_ranks(model_dir, tmp_path):
        assert report["failed"] == [], report
        assert report["shard_bytes"] < 0.51 * report["full_bytes"], report
        assert report["growth_bytes"] < GROWTH_SHARE * report["full_bytes"], report


def test_lora_adapters_on_sharded_ranks_start_as_peft_starts_them(model_dir: Path, tmp_path: Path) -> None:
    for report in load_on_two_ranks(model_dir, tmp_path, "--lora"):
        assert report["failed"] == [], report
