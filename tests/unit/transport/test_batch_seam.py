"""The batch seam's filesystem transport: what is sent is what is received, and a missing batch
times out naming where it was expected."""

import threading

import pytest

from envrl.transport.batches import BatchTimeout, FileBatchReceiver, FileBatchSender
from tests.support.samples import synthetic_samples


def receiver(tmp_path, timeout_s: float = 5.0) -> FileBatchReceiver:
    return FileBatchReceiver(tmp_path, timeout_s=timeout_s, poll_s=0.01, log_every_s=60.0)


def test_a_sent_batch_is_received_with_the_same_samples(tmp_path):
    samples = synthetic_samples(4, seed=1, policy_step=3)
    sender = threading.Timer(0.1, FileBatchSender(tmp_path).send_batch, (3, samples, {"state.json": b"{}"}))
    sender.start()
    got = receiver(tmp_path)
    assert got.wait(3) >= 0
    assert got.receive(3) == samples
    assert (tmp_path / "rollouts" / "step_3" / "state.json").read_bytes() == b"{}"


def test_a_batch_that_never_comes_times_out_naming_its_place(tmp_path):
    with pytest.raises(BatchTimeout, match=r"no batch at .*rollouts/step_0 after .*batch_timeout_s = 0.05"):
        receiver(tmp_path, timeout_s=0.05).wait(0)
