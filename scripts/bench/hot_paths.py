"""The small costs that shaped envrl's hot paths, each measured the way the code pays it.

    uv run --no-sync python -m scripts.bench.hot_paths [--repeats 20000]

Prints one line per cost (docs/measurements.md lists them with the design choice each explains):
- a `run` request frame parsed by `protocol.parse_request` (decode, shape and key checks), and
  its params validated by `ParamsChecker.run` (pydantic-core), per request;
- one message sent and received over an inproc ZMQ PAIR through pyzmq's `send_multipart` /
  `recv_multipart` wrappers against the raw Cython `send`/`recv` envrl calls (serve/zmqio.py);
- an EVENTS check on a socket, and one `recv` that ends in zmq.Again;
- one look for newly published weights (listing one directory, orchestrator/policy.py);
- the tiny model's tokenizer loaded as `chat_renderer` loads it;
- the RSS of a fresh interpreter after importing the fast tokenizer class alone against
  `AutoTokenizer` (which imports torch), and the import time of matplotlib (launcher/main.py).
Timings are the best of 5 rounds (another process only ever slows a round down).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from envrl.data.layout import published_steps
from envrl.serve import protocol as p
from envrl.serve.params import ParamsChecker
from envrl.serve.zmqio import EVENTS, NOBLOCK, raw_recv, raw_send
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

ROUNDS = 5


def per_call_us(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / repeats * 1e6


def fresh_interpreter(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def rss_after_import(statement: str) -> str:
    """Resident memory of a fresh interpreter after `statement` (VmRSS: ru_maxrss would carry the
    forking parent's peak across exec)."""
    code = f"{statement}\nimport re; print(int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024)"
    return fresh_interpreter(code) + " MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20000)
    n = parser.parse_args().repeats

    checker = ParamsChecker({"train": 100, "eval": 0}, max_group_size=64, has_client=True)
    params = {"task_idx": 3, "split": "train", "sampling": {}}
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 256}
    request = p.encode(
        {"id": "a1b2c3-17", "method": "run", "params": {**params, "n": 8, "seed": 7, "sampling": sampling}}
    )
    print(f"run request frame parsed:          {per_call_us(lambda: p.parse_request(request, 1 << 20), n):8.2f} us")
    print(f"run params validated:              {per_call_us(lambda: checker.run(params, 'r'), n):8.2f} us")

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://hot-paths")  # no I/O thread in the loop: what is left is the per-message call
    b.connect("inproc://hot-paths")
    frame = b"x" * 256
    a.send(b"warm-up"), b.recv()

    def wrapped() -> None:
        a.send_multipart([frame])
        b.recv_multipart()

    def raw() -> None:
        raw_send(a, frame, 0)
        raw_recv(b, 0)

    def again() -> None:
        with contextlib.suppress(zmq.Again):
            raw_recv(b, NOBLOCK)

    print(f"send+recv, send/recv_multipart:    {per_call_us(wrapped, n):8.2f} us")
    print(f"send+recv, raw Cython send/recv:   {per_call_us(raw, n):8.2f} us")
    print(f"EVENTS check:                      {per_call_us(lambda: b.getsockopt(EVENTS), n):8.2f} us")
    print(f"recv ending in zmq.Again:          {per_call_us(again, n):8.2f} us")
    a.close(0), b.close(0), ctx.term()

    with tempfile.TemporaryDirectory() as run:
        (Path(run) / "weights").mkdir()
        print(
            f"look for published weights:        {per_call_us(lambda: published_steps(Path(run) / 'weights'), n):8.2f} us"
        )

    load = (
        "import time; from transformers import PreTrainedTokenizerFast as T; s = time.perf_counter(); "
        f"T.from_pretrained({str(DEFAULT_DIR)!r}); print(f'{{time.perf_counter() - s:.3f}} s')"
    )
    print(f"tokenizer load (tiny model):       {fresh_interpreter(load):>11}")
    print(
        f"RSS, fast tokenizer class only:    {rss_after_import('from transformers import PreTrainedTokenizerFast'):>11}"
    )
    print(
        f"RSS, AutoTokenizer (imports torch):{rss_after_import('from transformers import AutoTokenizer; import torch'):>11}"
    )
    timed = "import time; s = time.perf_counter(); import matplotlib.pyplot; print(f'{time.perf_counter() - s:.2f} s')"
    print(f"import matplotlib.pyplot:          {fresh_interpreter(timed):>11}")


if __name__ == "__main__":
    main()
