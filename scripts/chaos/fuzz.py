"""Fuzz an env server with untyped and type-confused frames; fail if it dies or leaves one unanswered.

Guarantee: `fuzz` returns a `FuzzReport` whose `missing` and `extra` are empty exactly when every
frame whose first part holds a msgpack map with a string `id` (decoded as the server decodes it,
within `max_frame_bytes`) got exactly one answer with that id, and `alive` is true when the server
afterwards still answers `health` and runs a real rollout.

    .venv/bin/python scripts/chaos/fuzz.py [--frames 100000] [--seed 0] [--address tcp://...]

Without --address it starts `env-server --env.id reverse-text --client <SCRIPTED>` (1 static worker)
on a free port and stops it afterwards; a server given with --address needs a model client of its own.
The frames: well-formed health/info/run/cancel requests and protocol 2's `bind` (refused), and the
same with wrong types in every params field (lists, maps, NaN/inf, 64-bit extremes, bytes, nesting),
missing and unknown keys, bad and huge `n`, runs that carry a client of their own, garbage bytes, truncated
msgpack, oversized and multi-frame messages. tests/integration/test_env_server_fuzz.py runs a
CI-sized share of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

SCRIPTED = {"type": "scripted", "replies": ["olleh"]}
SAMPLING = {"max_tokens": 16}
NASTY: list[Any] = [
    None, True, False, 0, -1, 1.5, math.nan, math.inf, -math.inf, 2**63 - 1, -(2**63), 2**64 - 1, "", "x" * 300,
    "train", "eval", "\u2603", b"\x00\xff", [], [1, "a"], {}, {"a": 1}, {"type": "train"}, [[[[[]]]]],
    {"a": {"b": {"c": [1, {"d": math.nan}]}}},
]  # fmt: skip
"""Values substituted for any field: every msgpack type, and values that are edge cases for several."""
BAD_CLIENTS: list[Any] = [
    {"type": "eval", "base_url": "http://203.0.113.9/v1", "model": "m", "api_key_env": "HOME"},
    {"type": "train", "base_url": "http://127.0.0.1:1", "model": "gpt2"},
    {"type": "scripted", "tokenizer": "/etc"},
    {"type": "scripted", "replies": "not a list"},
    {"type": "nope"},
    {"type": "scripted", "delay_s": math.nan},
]
BAD_N: list[Any] = [0, -1, 2**63 - 1, 2**64 - 1, 10**6, 1.0, "3", None, [2], math.nan]


@dataclass
class FuzzReport:
    frames: int = 0
    seconds: float = 0.0
    expected: Counter[str] = field(default_factory=Counter)
    """Answers owed, by id (an id sent twice on purpose is owed twice)."""
    answered: Counter[str] = field(default_factory=Counter)
    anonymous: int = 0
    """Answers with id null (frames whose id could not be read)."""
    kinds: Counter[str] = field(default_factory=Counter)
    """Answers by outcome: ok, an error type, or trace:<error type> for error Traces."""
    alive: bool = False

    @property
    def missing(self) -> list[str]:
        return sorted((self.expected - self.answered).elements())

    @property
    def extra(self) -> list[str]:
        return sorted((self.answered - self.expected).elements())

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in self.kinds.most_common())
        return (
            f"{self.frames} frames in {self.seconds:.1f} s ({self.frames / max(self.seconds, 1e-9):.0f}/s); "
            f"{sum(self.answered.values())} answers by id, {self.anonymous} without; missing {len(self.missing)}, "
            f"extra {len(self.extra)}; server alive afterwards: {self.alive}; answers: {kinds}"
        )


def owed_id(frames: list[bytes], max_frame_bytes: int) -> str | None:
    """The id the server owes an answer to (docs/protocol.md): the string `id` of a first frame that
    is a msgpack map, however its other entries decode; read entry by entry, skipping the rest."""
    first = frames[0]
    if len(first) > max_frame_bytes:
        return None
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(first)
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "id":
                request_id = unpacker.unpack()
                return request_id if isinstance(request_id, str) else None
            unpacker.skip()
    except Exception:  # noqa: BLE001 - a frame that is not a map with a readable id owes an anonymous answer
        return None
    return None


class FrameMaker:
    """Random request messages (lists of frames), reproducible from `seed`."""

    def __init__(self, seed: int, num_tasks: int, max_frame_bytes: int) -> None:
        self.rng = random.Random(seed)
        self.num_tasks = num_tasks
        self.max_frame_bytes = max_frame_bytes
        self.count = 0
        self.sent_ids: list[str] = []

    def new_id(self) -> str:
        self.count += 1
        return f"f{self.count}"

    def run_params(self) -> dict[str, Any]:
        rng = self.rng
        params: dict[str, Any] = {"task_idx": rng.randrange(self.num_tasks), "sampling": SAMPLING}
        if rng.random() < 0.3:
            params["seed"] = rng.randrange(1000)
        if rng.random() < 0.4:
            params["n"] = rng.randint(1, 3)
        return params

    def message(self) -> list[bytes]:
        rng = self.rng
        kind = rng.random()
        if kind < 0.04:
            return [rng.randbytes(rng.randint(0, 64))]
        if kind < 0.06:
            good = self.pack({"id": self.new_id(), "method": "health"})
            return [good[: rng.randint(0, len(good) - 1)]]  # truncated msgpack
        if kind < 0.08:
            return [self.pack(self.request()), *(rng.randbytes(rng.randint(0, 16)) for _ in range(rng.randint(1, 3)))]
        if kind < 0.0805:
            return [self.pack({"id": self.new_id(), "method": "health", "params": {"pad": "x" * self.max_frame_bytes}})]
        if kind < 0.10:
            return [self.pack(self.envelope_confused())]
        return [self.pack(self.request())]

    def pack(self, message: Any) -> bytes:
        return msgpack.packb(message, use_bin_type=True)

    def envelope_confused(self) -> Any:
        rng = self.rng
        message: dict[Any, Any] = {
            "id": self.new_id(),
            "method": rng.choice(["health", "run", "cancel"]),
            "params": {},
        }
        key = rng.choice(["id", "method", "params", "extra"])
        message[key] = rng.choice(NASTY)
        if rng.random() < 0.2:
            del message["method"]
        return message if rng.random() < 0.9 else rng.choice(NASTY)

    def request(self) -> dict[str, Any]:
        rng = self.rng
        method = rng.choices(["health", "info", "bind", "run", "cancel", "bogus"], [2, 1, 2, 10, 3, 1])[0]
        request_id = self.new_id() if rng.random() > 0.01 or not self.sent_ids else rng.choice(self.sent_ids[-50:])
        if method == "cancel":
            target = rng.choice(self.sent_ids[-200:]) if self.sent_ids and rng.random() < 0.7 else self.new_id()
            params: dict[str, Any] = {"request_id": target}
        elif method == "run":
            params = self.run_params()
        elif method == "bind":  # protocol 2's: refused, the client is the server's config
            params = {"client": SCRIPTED}
        else:
            params = {}
        if rng.random() < 0.75:
            self.confuse(method, params)
        self.sent_ids.append(request_id)
        if len(self.sent_ids) > 1000:
            del self.sent_ids[:500]
        return {"id": request_id, "method": method, "params": params}

    def confuse(self, method: str, params: dict[str, Any]) -> None:
        """Break `params` one way: a wrong-typed field, a missing or unknown key, a bad n, a client
        of the request's own (hostile or not)."""
        rng = self.rng
        how = rng.random()
        keys = list(params) or ["task_idx"]
        if how < 0.45:
            params[rng.choice([*keys, "split", "seed", "n", "model", "client", "sampling", "request_id"])] = rng.choice(
                NASTY
            )
        elif how < 0.55 and params:
            del params[rng.choice(keys)]
        elif how < 0.62:
            params[rng.choice(["unknown", "x", "task", ""])] = rng.choice(NASTY)
        elif how < 0.72:
            params["n"] = rng.choice(BAD_N)
        elif how < 0.77:
            params["client"] = rng.choice(BAD_CLIENTS)
        elif how < 0.82:
            params["client"] = SCRIPTED
        elif how < 0.92:
            sampling = dict(SAMPLING)
            sampling[rng.choice(["max_tokens", "temperature", "top_p", "stop", "seed", "extra", "bogus"])] = rng.choice(
                NASTY
            )
            params["sampling"] = sampling
        else:
            params["task_idx"] = rng.choice([self.num_tasks, 2**63 - 1, 2**64 - 1, -(2**63), -1])


def fuzz(address: str, frames: int, seed: int = 0, max_frame_bytes: int = 65536, window: int = 2000,
         progress_every: int = 0, answer_timeout: float = 60.0) -> FuzzReport:  # fmt: skip
    """Send `frames` messages to the server at `address`, at most `window` owed answers unread, and
    check the answers; then check the server still serves (`alive`)."""
    num_tasks = asyncio.run(_num_tasks(address))
    maker = FrameMaker(seed, num_tasks, max_frame_bytes)
    report = FuzzReport()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(address)
    started = time.monotonic()
    last_answer = started
    owed = 0
    try:
        while report.frames < frames or owed:
            if report.frames < frames and owed < window:
                message = maker.message()
                request_id = owed_id(message, max_frame_bytes)
                if request_id is not None:
                    report.expected[request_id] += 1
                    owed += 1
                sock.send_multipart(message)
                report.frames += 1
                if progress_every and report.frames % progress_every == 0:
                    print(
                        f"{report.frames} frames sent, {report.frames - owed} settled, {owed} answers owed", flush=True
                    )
            elif not sock.poll(100):
                if time.monotonic() - last_answer > answer_timeout:
                    break
                continue
            while sock.poll(0):
                owed -= _count(report, msgpack.unpackb(sock.recv(), raw=False))
                last_answer = time.monotonic()
    finally:
        sock.close()
        context.term()
    report.seconds = time.monotonic() - started
    report.alive = asyncio.run(_serves(address))
    return report


def _count(report: FuzzReport, answer: dict[str, Any]) -> int:
    """Record `answer`; return 1 if it paid an owed answer, else 0."""
    request_id = answer["id"]
    paid = 0
    if request_id is None:
        report.anonymous += 1
    else:
        paid = int(report.answered[request_id] < report.expected[request_id])
        report.answered[request_id] += 1
    if not answer["ok"]:
        report.kinds[answer["error"]["type"]] += 1
        return paid
    result = answer["result"]
    traces = result.get("traces", [result]) if isinstance(result, dict) else []
    errors = [t["error"]["type"] for t in traces if isinstance(t, dict) and t.get("error")]
    report.kinds[f"trace:{errors[0]}" if errors else "ok"] += 1
    return paid


async def _num_tasks(address: str) -> int:
    """The server's train task count."""
    from envrl.envclient.client import EnvClient

    async with EnvClient(address) as client:
        return (await client.wait_until_ready(60)).num_tasks


async def _serves(address: str) -> bool:
    """True if the server answers health and runs a real rollout within a few seconds."""
    from envrl.envclient.client import EnvClient, EnvServerError

    try:
        async with EnvClient(address, timeout=30) as client:
            health = await asyncio.wait_for(client.health(), 5)
            (trace,) = await client.run(0, sampling=SAMPLING)
            return health.status == "ok" and trace.error is None
    except (EnvServerError, TimeoutError):
        return False


@contextmanager
def started_server(*args: str, name: str = "fuzzed env-server") -> Iterator[tuple[str, int]]:
    """A reverse-text env server on a free port with options `args` (defaults: 1 static worker,
    scoring in a thread): its (address, pid); stopped on exit (saying so if it had died)."""
    from envrl.runtime.process import spawn_sidecar

    argv = [
        sys.executable, "-m", "envrl.serve.main", "--env.id", "reverse-text", "--address", "tcp://127.0.0.1:0",
        "--pool", '{"min_workers": 1, "max_workers": 1}', "--client", json.dumps(SCRIPTED),
        "--timeout", '{"rollout_s": 5, "scoring_s": null}',  # scoring in a thread: no fork per rollout
        *args,
    ]  # fmt: skip
    child, address = spawn_sidecar(argv, name=name, ready_timeout=120)
    try:
        yield address, child.pid
    finally:
        code = child.poll()
        child.stop(grace=10)
        if code is not None:
            print(f"the server had exited ({child.describe_exit()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--address", help="fuzz this server instead of starting one (its --max-frame-bytes must match)")
    parser.add_argument("--max-frame-bytes", type=int, default=65536)
    parser.add_argument("--window", type=int, default=2000, help="most answers owed before sending waits")
    args = parser.parse_args()
    server = (
        nullcontext((args.address, None))
        if args.address
        else started_server("--max-frame-bytes", str(args.max_frame_bytes))
    )
    with server as (address, _):
        report = fuzz(address, args.frames, args.seed, args.max_frame_bytes, args.window, progress_every=10_000)
    print(report.summary(), flush=True)
    if report.missing or report.extra or not report.alive:
        print(
            f"FAILED: missing {report.missing[:20]}, extra {report.extra[:20]}, alive {report.alive}", file=sys.stderr
        )
        raise SystemExit(1)


if __name__ == "__main__":
    main()
