"""The trainer's memory transport: a published policy is a `transfer.json` whose sender hands
every replica the tensors the files would hold; a snapshot is released once a newer policy has
been served; the last policy and every checkpoint-interval one are files."""

from __future__ import annotations

import stat

import torch

from envrl.data.layout import weights_dir
from envrl.transport.memory import read_secret, read_transfer, remove_stale_transfers
from tests.support.trainers import make_trainer, tensor_names
from tests.unit.transport.receivers import receive


def receive_as_a_replica(path) -> dict[str, torch.Tensor]:
    """What one replica (rank 1 of 2) receives for the policy published in `path`."""
    return receive(read_transfer(path), read_secret(path), rank=1, world_size=2)


def test_a_policy_sent_in_memory_is_what_the_files_would_hold(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=5, ckpt={"interval": 4}, weights={"transport": "memory"})
    publisher = trainer.publisher
    try:
        assert publisher.publish(trainer.learner.model, 1, last=False)
        first = weights_dir(tmp_path, 1)
        assert sorted(p.name for p in first.iterdir()) == ["transfer.json", "transfer.secret"]
        assert stat.S_IMODE((first / "transfer.secret").stat().st_mode) == 0o600
        received = receive_as_a_replica(first)
        assert publisher.senders[0].served.wait(30)

        files = make_trainer(tmp_path / "files")
        files.publisher.publish(files.learner.model, 1, last=False)
        assert sorted(received) == tensor_names(weights_dir(tmp_path / "files", 1))  # tied lm_head left out
        state = trainer.learner.model.state_dict()
        assert all(torch.equal(tensor, state[name]) for name, tensor in received.items())

        with torch.no_grad():  # training goes on: the snapshot sent later is still policy 2's
            publisher.publish(trainer.learner.model, 2, last=False)
            snapshot = {name: p.clone() for name, p in trainer.learner.model.named_parameters()}
            for p in trainer.learner.model.parameters():
                p.add_(1.0)
        assert len(publisher.senders) == 1, "policy 1's sender is released once a newer one is published"
        second = receive_as_a_replica(weights_dir(tmp_path, 2))
        assert all(torch.equal(tensor, snapshot[name]) for name, tensor in second.items())

        publisher.publish(trainer.learner.model, 4, last=False)  # a checkpoint step: files
        publisher.publish(trainer.learner.model, 5, last=True)  # the last policy: files
        for step in (4, 5):
            assert (weights_dir(tmp_path, step) / "model.safetensors").is_file()
    finally:
        publisher.close()
    assert publisher.senders == []


def test_a_restarted_trainer_removes_the_policies_its_predecessor_sent_in_memory(tmp_path):
    """Their sender died with it: a replica must not go looking for it (a process may hold its
    port now). Files, and a directory holding more than envrl wrote, stay."""
    trainer = make_trainer(tmp_path, max_steps=5, ckpt={"interval": 4}, weights={"transport": "memory"})
    try:
        trainer.publisher.publish(trainer.learner.model, 1, last=False)  # memory
        trainer.publisher.publish(trainer.learner.model, 4, last=False)  # files
        trainer.publisher.publish(trainer.learner.model, 5, last=False)  # memory
    finally:
        trainer.publisher.close()
    (weights_dir(tmp_path, 5) / "notes.txt").write_text("not envrl's")
    restarted = make_trainer(tmp_path, max_steps=5, ckpt={"interval": 4}, weights={"transport": "memory"})
    restarted.publisher.close()
    assert not weights_dir(tmp_path, 1).exists()
    assert (weights_dir(tmp_path, 4) / "model.safetensors").is_file()
    assert (weights_dir(tmp_path, 5) / "notes.txt").is_file()
    assert remove_stale_transfers(tmp_path) == []
