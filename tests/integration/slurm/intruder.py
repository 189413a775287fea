"""What another user on a job's host gets from the run's listeners on the other hosts: run as
`nobody` inside a node's namespace, it prints one JSON map of each attempt's outcome."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

import zmq


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
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send(b"\x81\xa4type\xa6health")  # msgpack {"type": "health"}
        return bool(socket.poll(wait_ms))
    finally:
        socket.close()
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inference", required=True, help="http://host:port of a replica")
    parser.add_argument("--env", required=True, help="tcp://host:port of an env server")
    args = parser.parse_args()
    base, update = args.inference, {"path": "/nonexistent", "step": 10_000}
    print(json.dumps({
        "models, no key": http_status(f"{base}/v1/models"),
        "completions, no key": http_status(f"{base}/v1/completions", {"model": "x", "prompt": "hi"}),
        "update, no token": http_status(f"{base}/update_weights", update),
        "update, guessed token": http_status(f"{base}/update_weights", update, token="guessed"),
        "env server answers": env_server_answers(args.env),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
