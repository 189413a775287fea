"""What another user on a job's host gets from the run's listeners and files on the other hosts: run
as `nobody` inside a node's namespace, it prints one JSON map of each attempt's outcome."""

from __future__ import annotations

import argparse
import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

import zmq

from envrl.transport.rendezvous import CLIENT_PROOF, GET, HEADER, HELLO, MAGIC


def http_status(url: str, body: dict | None = None, token: str | None = None) -> int:
    """The HTTP status of GET `url` (POST of `body`); -1 if nothing answered."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return -1


def env_server_answers(address: str, wait_ms: int = 3000) -> bool:
    """Whether the env server at `address` answers a plaintext (no CURVE keys) client at all."""
    context = zmq.Context()
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    try:
        socket_.connect(address)
        socket_.send(b"\x81\xa4type\xa6health")  # msgpack {"type": "health"}
        return bool(socket_.poll(wait_ms))
    finally:
        socket_.close()
        context.term()


def readable(paths: list[Path]) -> list[str]:
    """Which of `paths` this user could list (a directory) or read (a file)."""
    opened = []
    for path in paths:
        try:
            os.listdir(path) if path.is_dir() else path.read_bytes()
            opened.append(str(path))
        except OSError:
            pass
    return opened


def rendezvous_answer(host: str, port: int, payload: bytes) -> str:
    """What the weight-transfer rendezvous at host:port does with `payload` sent after its hello:
    "refused" (nothing listens), "closed" or "reset" (it dropped us), "answered" or "kept open"."""
    try:
        with socket.create_connection((host, port), timeout=10) as conn:
            conn.settimeout(20)  # more than the rendezvous' handshake deadline
            hello = conn.recv(HELLO)
            if not hello.startswith(MAGIC):
                return f"not a rendezvous: {hello[:40]!r}"
            conn.sendall(payload)
            return "answered" if conn.recv(1 << 16) else "closed"
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "kept open"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inference", help="http://host:port of a replica")
    parser.add_argument("--env", help="tcp://host:port of an env server")
    parser.add_argument("--rendezvous", help="host:port of the trainer's weight-transfer rendezvous")
    parser.add_argument("--files", nargs="*", type=Path, default=[], help="the run's files and directories")
    args = parser.parse_args()
    tried: dict[str, object] = {}
    if args.inference:
        base, update = args.inference, {"path": "/nonexistent", "step": 10_000}
        tried["models, no key"] = http_status(f"{base}/v1/models")
        tried["completions, no key"] = http_status(f"{base}/v1/completions", {"model": "x", "prompt": "hi"})
        tried["update, no token"] = http_status(f"{base}/update_weights", update)
        tried["update, guessed token"] = http_status(f"{base}/update_weights", update, token="guessed")
    if args.env:
        tried["env server answers"] = env_server_answers(args.env)
    if args.rendezvous:
        host, port = args.rendezvous.rsplit(":", 1)
        tried["join, guessed proof"] = rendezvous_answer(host, int(port), os.urandom(CLIENT_PROOF))
        key = b"world_size"  # a store read with no proof first
        tried["read, no proof"] = rendezvous_answer(host, int(port), HEADER.pack(GET, len(key), 0) + key)
    if args.files:
        tried["readable"] = readable(args.files)
    print(json.dumps(tried))


if __name__ == "__main__":
    main()
