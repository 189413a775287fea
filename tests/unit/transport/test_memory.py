"""The in-memory weight transport's own half, without vLLM: buckets both ends agree on, a
broadcast every receiver gets bit for bit, and a sender nobody comes for fails naming why."""

import threading

import torch
import torch.distributed as dist

from envrl.transport.memory import (
    WORLD_SIZE_KEY,
    PolicySender,
    TransferInfo,
    gloo_group,
    plan_buckets,
    receive_gloo,
)


def test_buckets_pack_consecutive_tensors_and_a_large_one_travels_alone():
    dtypes = ["float32", "float32", "bfloat16", "float32"]
    shapes = [[4], [4], [100], [2]]  # 16, 16, 200, 8 bytes
    assert plan_buckets(dtypes, shapes, bucket_bytes=40) == [[0, 1], [2], [3]]
    assert plan_buckets(dtypes, shapes, bucket_bytes=10**6) == [[0, 1, 2, 3]]


def receive(info: TransferInfo, rank: int, world_size: int, out: dict[int, dict[str, torch.Tensor]]) -> None:
    store = dist.TCPStore(info.host, info.port, is_master=False)
    store.set(WORLD_SIZE_KEY, str(world_size))
    group = gloo_group(store, rank, world_size, timeout_s=60)
    out[rank] = {name: tensor.clone() for bucket in receive_gloo(group, info) for name, tensor in bucket}


def test_every_receiver_gets_the_sent_tensors_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    named = [
        ("embed.weight", torch.randn(64, 16, generator=generator)),
        ("layers.0.norm.weight", torch.randn(16, generator=generator).to(torch.bfloat16)),
        ("layers.0.proj.weight", torch.randn(16, 16, generator=generator)),
        ("step", torch.tensor([7], dtype=torch.int64)),
    ]
    published: list[TransferInfo] = []
    received: dict[int, dict[str, torch.Tensor]] = {}
    ready = threading.Event()

    def publish(content: bytes) -> None:
        published.append(TransferInfo.model_validate_json(content))
        ready.set()

    sender = PolicySender(3, named, backend="gloo", host="127.0.0.1", timeout_s=60, bucket_bytes=1024, publish=publish)
    assert ready.is_set()
    receivers = [threading.Thread(target=receive, args=(published[0], rank, 3, received)) for rank in (1, 2)]
    for thread in receivers:
        thread.start()
    for thread in receivers:
        thread.join(60)
    assert sender.served.wait(60) and sender.error is None
    sender.close()
    assert published[0].step == 3 and published[0].names == [name for name, _ in named]
    for rank in (1, 2):
        assert list(received[rank]) == [name for name, _ in named]
        for name, tensor in named:
            assert received[rank][name].dtype == tensor.dtype
            assert torch.equal(received[rank][name], tensor)


def test_a_closed_sender_releases_its_snapshot_and_stops_waiting():
    sender = PolicySender(
        2, [("w", torch.zeros(2))], backend="gloo", host="127.0.0.1", timeout_s=60, bucket_bytes=1024,
        publish=lambda content: None,
    )  # fmt: skip
    sender.close()
    assert not sender._thread.is_alive() and sender._tensors is None
    assert not sender.served.is_set() and sender.error is None
