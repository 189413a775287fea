"""The in-memory weight transport's own half, without vLLM: buckets both ends agree on, a
broadcast every receiver gets bit for bit, and a sender nobody comes for releases its snapshot."""

import base64
import threading

import torch

from envrl.transport.broadcast import plan_buckets
from envrl.transport.memory import PolicySender, TransferInfo, TransferSecret
from tests.unit.transport.receivers import receive


def test_buckets_pack_consecutive_tensors_and_a_large_one_travels_alone():
    dtypes = ["float32", "float32", "bfloat16", "float32"]
    shapes = [[4], [4], [100], [2]]  # 16, 16, 200, 8 bytes
    assert plan_buckets(dtypes, shapes, bucket_bytes=40) == [[0, 1], [2], [3]]
    assert plan_buckets(dtypes, shapes, bucket_bytes=10**6) == [[0, 1, 2, 3]]


def test_every_receiver_gets_the_sent_tensors_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    named = [
        ("embed.weight", torch.randn(64, 16, generator=generator)),
        ("layers.0.norm.weight", torch.randn(16, generator=generator).to(torch.bfloat16)),
        ("layers.0.proj.weight", torch.randn(16, 16, generator=generator)),
        ("step", torch.tensor([7], dtype=torch.int64)),
    ]
    published: list[tuple[TransferInfo, TransferSecret]] = []
    received: dict[int, dict[str, torch.Tensor]] = {}
    ready = threading.Event()

    def publish(content: bytes, secret: TransferSecret) -> None:
        published.append((TransferInfo.model_validate_json(content), secret))
        ready.set()

    sender = PolicySender(3, named, backend="gloo", host="127.0.0.1", timeout_s=60, bucket_bytes=1024, publish=publish)
    assert ready.is_set()
    info, secret = published[0]

    def receive_as(rank: int) -> None:
        received[rank] = receive(info, secret, rank, world_size=3)

    receivers = [threading.Thread(target=receive_as, args=(rank,)) for rank in (1, 2)]
    for thread in receivers:
        thread.start()
    for thread in receivers:
        thread.join(60)
    assert sender.served.wait(60) and sender.error is None
    sender.close()
    assert info.step == 3 and info.names == [name for name, _ in named]
    for rank in (1, 2):
        assert list(received[rank]) == [name for name, _ in named]
        for name, tensor in named:
            assert received[rank][name].dtype == tensor.dtype
            assert torch.equal(received[rank][name], tensor)


def test_a_closed_sender_releases_its_snapshot_and_stops_waiting():
    sender = PolicySender(
        2, [("w", torch.zeros(2))], backend="gloo", host="127.0.0.1", timeout_s=60, bucket_bytes=1024,
        publish=lambda content, secret: None,
    )  # fmt: skip
    sender.close()
    assert not sender._thread.is_alive() and sender._tensors is None
    assert not sender.served.is_set() and sender.error is None


def test_on_nccl_the_workers_join_from_the_unique_id_in_the_request_and_open_no_store():
    """vLLM's own worker-side init info takes what the replica passes on nccl: the unique id
    (vLLM's `worker_init_process_group` then joins through `uid_init_process_group`, no
    TCPStore, no StatelessProcessGroup and its pickles), no rendezvous address."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    info = TransferInfo(step=1, backend="nccl", host="127.0.0.1", port=1234, names=[], dtype_names=[], shapes=[])
    unique_id = bytes(range(128))
    secret = TransferSecret(secret="ab" * 16, nccl_unique_id_b64=base64.b64encode(unique_id).decode())
    payload = info.init_info(rank_offset=1, world_size=3, secret=secret)
    assert "master_address" not in payload and "master_port" not in payload and "secret" not in payload
    parsed = NCCLWeightTransferInitInfo(**payload)
    assert parsed.nccl_unique_id_bytes == unique_id and parsed.master_address is None
    assert (parsed.rank_offset, parsed.world_size, parsed.packed) == (1, 3, True)
