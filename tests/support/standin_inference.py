"""`python -m tests.support.standin_inference MODEL_DIR COMPLETION_IDS STOP_AT`: enough of envrl's
inference server for the orchestrator and the train client, in a process of its own.

Guarantee: prints `port <n>` once it listens on 127.0.0.1; answers `/health`, `/weights` (MODEL_DIR,
resolved), `/v1/models` and `/update_weights`; every `/inference/v1/generate` is answered with the
JSON list COMPLETION_IDS (logprob -1 each, finish "stop"), except that the STOP_AT-th generate
request (1-based; 0: never) makes the process SIGSTOP itself before answering: a model server
that stops answering, with a request in flight.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class JsonHandler(BaseHTTPRequestHandler):
    """An http.server handler that answers JSON and keeps quiet in the test's output."""

    def _reply(self, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a loopback port for the block (stopped however it ends): its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main() -> None:
    model, completion, stop_at = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    resolved = str(Path(model).resolve())
    lock, seen = threading.Lock(), [0]

    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._reply({})
            elif self.path == "/weights":
                self._reply({"path": resolved})
            else:  # /v1/models
                self._reply({"data": [{"id": model, "max_model_len": 2048}]})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/update_weights":
                self._reply({"status": "ok"})
                return
            with lock:
                seen[0] += 1
                stop = seen[0] == stop_at
            if stop:
                os.kill(os.getpid(), signal.SIGSTOP)
            choice = {"index": 0, "token_ids": completion, "finish_reason": "stop"}
            choice["logprobs"] = {"content": [{"logprob": -1.0} for _ in completion]}
            self._reply({"choices": [choice]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
