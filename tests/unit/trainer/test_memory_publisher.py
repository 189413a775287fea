"""The trainer's memory transport: a published policy is a `transfer.json` whose sender hands
every replica the tensors the files would hold; a snapshot is released once a newer policy has
been served; the last policy and every checkpoint-interval one are files."""

from __future__ import annotations

import torch
import torch.distributed as dist

from envrl.data.layout import weights_dir
from envrl.transport.memory import WORLD_SIZE_KEY, gloo_group, read_transfer, receive_gloo
from tests.support.trainers import make_trainer, tensor_names


def receive_as_a_replica(path) -> dict[str, torch.Tensor]:
    """What one replica (rank 1 of 2) receives for the policy published in `path`."""
    info = read_transfer(path)
    store = dist.TCPStore(info.host, info.port, is_master=False)
    store.set(WORLD_SIZE_KEY, "2")
    group = gloo_group(store, 1, 2, timeout_s=60)
    return {name: tensor.clone() for bucket in receive_gloo(group, info) for name, tensor in bucket}


def test_a_policy_sent_in_memory_is_what_the_files_would_hold(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=5, ckpt={"interval": 4}, weights={"transport": "memory"})
    publisher = trainer.publisher
    try:
        assert publisher.publish(trainer.model, 1, last=False)
        first = weights_dir(tmp_path, 1)
        assert [p.name for p in first.iterdir()] == ["transfer.json"]
        received = receive_as_a_replica(first)
        assert publisher.senders[0].served.wait(30)

        files = make_trainer(tmp_path / "files")
        files.publisher.publish(files.model, 1, last=False)
        assert sorted(received) == tensor_names(weights_dir(tmp_path / "files", 1))  # tied lm_head left out
        state = trainer.model.state_dict()
        assert all(torch.equal(tensor, state[name]) for name, tensor in received.items())

        with torch.no_grad():  # training goes on: the snapshot sent later is still policy 2's
            publisher.publish(trainer.model, 2, last=False)
            snapshot = {name: p.clone() for name, p in trainer.model.named_parameters()}
            for p in trainer.model.parameters():
                p.add_(1.0)
        assert len(publisher.senders) == 1, "policy 1's sender is released once a newer one is published"
        second = receive_as_a_replica(weights_dir(tmp_path, 2))
        assert all(torch.equal(tensor, snapshot[name]) for name, tensor in second.items())

        publisher.publish(trainer.model, 4, last=False)  # a checkpoint step: files
        publisher.publish(trainer.model, 5, last=True)  # the last policy: files
        for step in (4, 5):
            assert (weights_dir(tmp_path, step) / "model.safetensors").is_file()
    finally:
        publisher.close()
    assert publisher.senders == []
