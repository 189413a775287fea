"""The memory transport against other users of the node (issue 37): a process of another user
(`nobody`, standard library only) can neither reach the trainer's rendezvous on another address,
nor join it, nor read from it, nor stall a transfer, nor grow the trainer; a process that took a
dead sender's port is refused by the replicas; a policy nobody joins releases its snapshot."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import torch

from envrl.transport.memory import PolicySender, TransferInfo, TransferSecret
from envrl.transport.rendezvous import (
    HANDSHAKE_S,
    HELLO,
    RendezvousError,
    RendezvousServer,
    RendezvousStore,
    new_secret,
)
from tests.unit.transport.receivers import receive

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

OUTSIDER = r"""
import json, os, pickle, socket, struct, sys
port = int(sys.argv[1])
hello_bytes = int(sys.argv[2])
closes_within = float(sys.argv[3])  # an unproven connection is closed after this long
result = {}
try:  # another address of the host
    socket.create_connection(("127.0.0.2", port), timeout=5).close()
    result["other_address"] = "connected"
except OSError as e:
    result["other_address"] = type(e).__name__

def answered(payload):
    # What the rendezvous answers after its hello to `payload` (b"" once it closed on us).
    with socket.create_connection(("127.0.0.1", port), timeout=closes_within + 5) as s:
        s.settimeout(2)
        try:
            s.recv(hello_bytes)  # (a TCPStore says nothing first)
        except TimeoutError:
            pass
        s.settimeout(closes_within + 5)
        try:
            s.sendall(payload)
            return s.recv(1 << 16).hex()  # TimeoutError: the connection stayed open
        except OSError as e:
            return type(e).__name__

# join with a guessed proof; the TCPStore requests of the attack on the old code: world_size=2,
# a pickle under broadcast_from/0/0, a read of every key
result["guessed_proof"] = answered(os.urandom(48))
store_set = lambda key, value: bytes([0]) + struct.pack("<Q", len(key)) + key + struct.pack("<Q", len(value)) + value
result["store_set_world_size"] = answered(store_set(b"world_size", b"2"))
result["store_set_pickle"] = answered(store_set(b"broadcast_from/0/0", pickle.dumps(print)))
result["store_get"] = answered(bytes([1]) + struct.pack("<Q", 10) + b"world_size")

# 60 x 7 MiB writes (they grew the trainer by 440 MiB on the old code)
sent = 0
for _ in range(60):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"\0" * (7 << 20))
            sent += 7 << 20
    except OSError:
        pass
result["flood_bytes_accepted"] = sent

# hold many connections that never prove anything while the real replica joins
held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(200)]
print(json.dumps(result), flush=True)
sys.stdin.read()
"""


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.fixture
def sender() -> Iterator[tuple[PolicySender, TransferInfo, TransferSecret]]:
    published: list[tuple[TransferInfo, TransferSecret]] = []
    generator = torch.Generator().manual_seed(0)
    named = [("embed.weight", torch.randn(256, 64, generator=generator)), ("norm.weight", torch.randn(64))]
    sender = PolicySender(
        7, named, backend="gloo", host="127.0.0.1", timeout_s=120, bucket_bytes=2**16,
        publish=lambda content, secret: published.append((TransferInfo.model_validate_json(content), secret)),
    )  # fmt: skip
    try:
        yield sender, *published[0]
    finally:
        sender.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_another_user_can_neither_reach_join_read_grow_nor_stall_a_policy_sent_in_memory(sender) -> None:
    policy, info, secret = sender
    expected = {name: t.clone() for name, t in zip(info.names, policy._tensors or [], strict=True)}
    before = rss_bytes()
    outsider = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-I", "-c", OUTSIDER, str(info.port), str(HELLO), str(HANDSHAKE_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        result = json.loads(outsider.stdout.readline())  # type: ignore[union-attr]
        assert result["other_address"] == "ConnectionRefusedError", "the rendezvous listens on its host only"
        for probe in ("guessed_proof", "store_set_world_size", "store_set_pickle", "store_get"):
            assert result[probe] in ("", "ConnectionResetError", "BrokenPipeError"), (
                f"{probe}: answered {result[probe]}"
            )
        # Each unproven connection is dropped once it sends more than the 48-byte proof, after one
        # recv of at most 64 KiB + 9 bytes: the 420 MiB sent cannot stay in the trainer. 64 MiB
        # leaves room for the allocator's and the sender thread's own noise.
        assert rss_bytes() - before < 64 * 2**20
        assert not policy.sending.is_set(), "no outsider could start the transfer"

        received = receive(info, secret, rank=1, world_size=2)  # 200 unproven connections held meanwhile
        assert policy.served.wait(60) and policy.error is None
        assert list(received) == list(expected)
        assert all(torch.equal(received[name], tensor) for name, tensor in expected.items())
    finally:
        outsider.stdin.close()  # type: ignore[union-attr]
        outsider.wait(30)


def test_a_sender_that_cannot_prove_the_policy_secret_is_refused() -> None:
    """A process that bound the port of a dead sender (a stale transfer.json): as an envrl
    rendezvous with a secret of its own, or as anything else."""
    impostor = RendezvousServer("127.0.0.1", new_secret())
    try:
        with pytest.raises(RendezvousError, match="did not prove this policy's secret"):
            RendezvousStore("127.0.0.1", impostor.port, new_secret(), timeout_s=10)
    finally:
        impostor.close()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_like_a_tcpstore() -> None:
            conn, _ = listener.accept()
            with conn, contextlib.suppress(OSError):  # the replica hangs up on it
                conn.sendall(b"\0" * 64)
                conn.recv(1024)

        thread = threading.Thread(target=answer_like_a_tcpstore, daemon=True)
        thread.start()
        with pytest.raises(RendezvousError, match="refused"):
            RendezvousStore("127.0.0.1", port, new_secret(), timeout_s=10)
        thread.join(10)


def test_a_dead_sender_is_given_up_on_after_the_connect_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]  # closed below: nothing listens there any more
    with pytest.raises(RendezvousError, match="did not answer within 0.5 s"):
        RendezvousStore("127.0.0.1", port, new_secret(), timeout_s=10, connect_timeout_s=0.5)


def test_a_policy_nobody_joins_releases_its_snapshot() -> None:
    policy = PolicySender(
        3, [("w", torch.zeros(1024))], backend="gloo", host="127.0.0.1", timeout_s=0.5, bucket_bytes=1024,
        publish=lambda content, secret: None,
    )  # fmt: skip
    policy._thread.join(30)
    assert policy._tensors is None and not policy.served.is_set() and policy.error is None
    with pytest.raises(RendezvousError):  # the rendezvous is closed with it
        RendezvousStore("127.0.0.1", policy.info.port, policy.secret.secret, timeout_s=5, connect_timeout_s=0.5)
