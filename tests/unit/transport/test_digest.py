"""A policy's digest (transport/digest.py): what the trainer writes is what a replica accepts, and
a byte changed after the write, or in a gloo transfer, is refused naming the policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envrl.transport.broadcast import plan_buckets, tensor_bytes
from envrl.transport.digest import DIGEST_FILE, PolicyDigest, check_files_digest, digest_of
from envrl.transport.files import WeightsError, write_policy
from envrl.transport.memory import PolicySender, TransferInfo, TransferSecret
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.unit.transport.receivers import receive


def test_a_policy_written_as_files_passes_its_digest_until_a_byte_of_it_changes(tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR)
    target = tmp_path / "weights" / "step_1"
    write_policy(model, model.state_dict(), target, model.config, AutoTokenizer.from_pretrained(DEFAULT_DIR))
    assert len((target / DIGEST_FILE).read_text().strip()) == 64
    check_files_digest(target)
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's data
    weights.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=f"the policy in {target} is not what the trainer published"):
        check_files_digest(target)
    check_files_digest(DEFAULT_DIR)  # the base model has no digest: nothing to check


def test_the_bytes_a_gloo_transfer_carries_hash_as_the_trainers_tensors() -> None:
    named = [("a", torch.randn(3, 4)), ("b", torch.randn(5).to(torch.bfloat16)), ("c", torch.arange(7))]
    sent = digest_of(named)
    dtypes = [str(t.dtype).removeprefix("torch.") for _, t in named]
    shapes = [list(t.shape) for _, t in named]
    received = PolicyDigest()
    for bucket in plan_buckets(dtypes, shapes, bucket_bytes=32):
        buffer = torch.cat([named[i][1].reshape(-1).view(torch.uint8) for i in bucket])
        offset = 0
        for i in bucket:
            size = tensor_bytes(dtypes[i], shapes[i])
            received.add_bytes(named[i][0], dtypes[i], shapes[i], buffer[offset : offset + size])
            offset += size
    assert received.hexdigest() == sent


def test_a_receiver_refuses_a_policy_whose_bytes_do_not_hash_to_the_senders_digest() -> None:
    published: list[tuple[TransferInfo, TransferSecret]] = []
    named = [("w", torch.randn(8, 8)), ("b", torch.randn(8))]
    publish = lambda content, secret: published.append((TransferInfo.model_validate_json(content), secret))  # noqa: E731
    sender = PolicySender(5, named, backend="gloo", host="127.0.0.1", timeout_s=60, bucket_bytes=64, publish=publish)
    info, secret = published[0]
    assert info.digest == digest_of(named)
    forged = info.model_copy(update={"digest": "0" * 64})  # as if a byte had changed on the way
    with pytest.raises(WeightsError, match="the policy received in memory is not what the trainer sent"):
        receive(forged, secret, 1, world_size=2)
    sender.close()
