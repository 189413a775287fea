"""Floods from a real sandbox at the chat proxy and the bridge, and what they may cost the worker.

Each test is a real attempt by code in a bubblewrap sandbox: connections by the hundred straight
at its bridge socket, bodies of 16 MiB at a host service that would take them all and at the
program's own proxy session, junk requests by the dozen. The host service sees at most the
bridge's caps; a second rollout on the same worker completes normally while one floods; and the
worker's fds and memory grow by no more than the caps allow (bounds derived from the caps, never
from timing)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envrl.data.traces import Task, Trace
from envrl.envs import Rubric
from envrl.envs.adapters.agent_program import AgentProgramEnvironment
from envrl.model.client import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.proxy.chat import MAX_JSON_VALUES, MAX_WAITING, ProxyLimits
from envrl.sandbox import BubblewrapProvider, SandboxConfig, bridge
from tests.support.sandboxes import ALL_SANDBOXES, run_dir, wait_gone

__all__ = ["run_dir"]

MIB = 1 << 20
FLOOD_MIB = 16
"""Each flooding body: past the proxy's 1 MiB and the bridge's 4 MiB, small enough that the old
code's cost (a body read whole, decoded into millions of objects) stays survivable on a shared box."""
TOKENIZER = "deps/models/tiny-chat"


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


@dataclass
class Peaks:
    rss: int = 0
    fds: int = 0
    relays: int = 0


@contextmanager
def peaks() -> Iterator[Peaks]:
    """The highest RSS, open fds and live bridge relays of this process (the worker) while inside."""
    seen = Peaks()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.rss = max(seen.rss, _status("VmRSS"))
            seen.fds = max(seen.fds, len(os.listdir("/proc/self/fd")))
            seen.relays = max(seen.relays, bridge.WORKER.relays)
            done.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


class Counter:
    """A host service that takes every byte and never answers (what an interception server
    with a 1 GiB body limit does with a large body): counts connections and bytes."""

    def __init__(self) -> None:
        self.live = 0
        self.most_live = 0
        self.most_bytes = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        got = 0
        try:
            while data := await reader.read(1 << 16):
                got += len(data)
                self.most_bytes = max(self.most_bytes, got)
        except OSError:
            pass
        finally:
            self.live -= 1
            writer.close()


RAW_FLOOD = """
import os, socket, sys, time
port, conns, procs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
kids = []
for _ in range(procs):
    pid = os.fork()
    if pid == 0:
        held = []
        for _ in range(conns):  # without blocking: past the bridge's backlog, connect says EAGAIN
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            if s.connect_ex("/run/envrl-bridge/bridge.sock") == 0:
                s.send(b"%d\\n" % port)
                held.append(s)
            else:
                s.close()
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""

BODY_FLOOD = """
import socket, sys
port, mib = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect("/run/envrl-bridge/bridge.sock")
s.sendall(b"%d\\n" % port)
head = b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n" % (mib << 20)
sent = len(head)
s.sendall(head)
chunk = b"{}, " * (1 << 14)
try:
    while sent < (mib << 20):
        s.sendall(chunk)
        sent += len(chunk)
    print("sent all", sent)
except OSError as e:
    print("cut after", sent, type(e).__name__)
"""


def test_the_bridge_caps_a_sandboxes_connections_and_unanswered_bytes(run_dir: Path) -> None:
    async def main() -> tuple[Counter, str, str]:
        counter = Counter()
        server = await asyncio.start_server(counter.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        box = await BubblewrapProvider().create(SandboxConfig())
        try:
            await box.forward_host_ports([port])
            await box.write_file("raw.py", RAW_FLOOD)
            await box.write_file("body.py", BODY_FLOOD)
            raw = await box.run(["python3", "raw.py", str(port), "120", "4"], timeout=60)
            body = await box.run(["python3", "body.py", str(port), str(FLOOD_MIB)], timeout=60)
            after = await box.run(["echo", "still here"])
            assert after.stdout.strip() == "still here"  # the sandbox itself is unharmed
            return counter, raw.stderr, body.stdout
        finally:
            await box.close()
            server.close()

    counter, raw_err, body_out = asyncio.run(main())
    assert raw_err == ""
    # 480 connections asked for; the host service saw at most the sandbox's relay cap at once.
    assert 1 <= counter.most_live <= bridge.RELAYS_PER_SANDBOX, counter.most_live
    # A 16 MiB body that was never answered: cut at the sandbox's budget of unanswered bytes.
    assert "cut after" in body_out, body_out
    assert 0 < counter.most_bytes <= bridge.SANDBOX_BUDGET, counter.most_bytes
    assert bridge.WORKER.relays == 0 and bridge.WORKER.unanswered == 0  # every relay gave its share back
    assert wait_gone(ALL_SANDBOXES) == []


class Question(Task):
    question: str


FLOODING_AGENT = """
import http.client, json, os, socket, subprocess, sys, threading, urllib.request
from urllib.parse import urlsplit

task = json.load(open(0))
url = urlsplit(os.environ["OPENAI_BASE_URL"] + "/chat/completions")

def chat(body):
    request = urllib.request.Request(url.geturl(), data=body, headers={"Content-Type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]
    except Exception as e:
        return "refused %s" % getattr(e, "code", type(e).__name__)

def huge():
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = b'{"messages": [' + b"{}, " * ((MIB << 20) // 4) + b"{}]}"
    try:
        connection.request("POST", url.path, body=body, headers={"Content-Type": "application/json"})
        print("huge answered", connection.getresponse().status)
    except OSError as e:
        print("huge cut", type(e).__name__)

hello = json.dumps({"messages": [{"role": "user", "content": task["question"]}]}).encode()
if task["question"] == "flood":
    subprocess.run([sys.executable, "raw.py", str(url.port), "120", "4"], check=True)
    threads = [threading.Thread(target=huge) for _ in range(2)]
    threads += [threading.Thread(target=chat, args=(b"[1, 2]",)) for _ in range(2 * WAITING)]
    threads += [threading.Thread(target=chat, args=(b'{"messages": [' + b"[]," * VALUES + b"[]]}",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print(chat(hello), chat(hello))
"""


def test_one_rollout_flooding_its_proxy_and_bridge_cannot_hurt_another_on_its_worker(run_dir: Path) -> None:
    program = (
        FLOODING_AGENT.replace("MIB", str(FLOOD_MIB))
        .replace("WAITING", str(MAX_WAITING))
        .replace("VALUES", str(MAX_JSON_VALUES))
    )
    env = AgentProgramEnvironment(
        command=["python3", "agent.py"],
        files={"agent.py": program, "raw.py": RAW_FLOOD},
        tasks=[Question(idx=0, question="flood"), Question(idx=1, question="Write some numbers.")],
        rubric=Rubric({lambda answer: float(bool(answer)): 1.0}),
        sandbox=SandboxConfig(episode_s=120),
        timeout_s=100,
        proxy=ProxyLimits(),
    )
    client = ScriptedClient(ScriptedClientConfig(replies=["12 34", "5678"], tokenizer=TOKENIZER))
    sampling = SamplingArgs(max_tokens=8)

    async def main() -> tuple[list[Trace], Peaks, int, int]:
        try:
            # A first rollout alone: everything a rollout loads is loaded before the baseline.
            warm = await env.run_rollout(env.get_task("train", 1), client, sampling, scoring_timeout=30)
            assert warm.error is None, warm.error
            rss, fds = _status("VmRSS"), len(os.listdir("/proc/self/fd"))
            with peaks() as seen:
                traces = await asyncio.gather(
                    env.run_rollout(env.get_task("train", 0), client, sampling, scoring_timeout=30),
                    env.run_rollout(env.get_task("train", 1), client, sampling, scoring_timeout=30),
                )
            return list(traces), seen, rss, fds
        finally:
            await env.aclose()

    (flood, normal), seen, rss, fds = asyncio.run(main())
    # The other rollout on the worker completed normally: both its calls answered and recorded.
    assert normal.error is None and normal.reward == 1.0 and normal.num_turns == 2, normal.error
    assert "proxy_refused" not in normal.metrics
    # The flooding one got its 413s/400s/429s recorded, and its own session still answered it.
    assert flood.error is None and flood.metrics["proxy_refused"] >= 2 * MAX_WAITING, (flood.error, flood.metrics)
    assert flood.num_turns == 2
    # The worker held at most the relay caps of its two sandboxes at once...
    assert seen.relays <= 2 * bridge.RELAYS_PER_SANDBOX, seen.relays
    # ... so its fds grew by at most 3 per relay, plus each sandbox's own (bubblewrap's pipes,
    # its bridge listener, its proxy session's connections: under 32 each).
    assert seen.fds - fds <= 3 * 2 * bridge.RELAYS_PER_SANDBOX + 2 * 32, (fds, seen.fds)
    # Memory: per session one body in hand (1 MiB) decoded within MAX_JSON_VALUES (~100 B per
    # value), MAX_WAITING + 1 requests' read buffers (aiohttp keeps <= 256 KiB unread each), and the
    # bridge's unanswered bytes (SANDBOX_BUDGET) plus 2 x CHUNK per relay direction; the old code
    # grew by ~25 x FLOOD_MIB per body. 32 MiB more allows for the allocator and the second rollout.
    per_session = MIB + MAX_JSON_VALUES * 100 + (MAX_WAITING + 1) * 256 * 1024
    per_sandbox = bridge.SANDBOX_BUDGET + bridge.RELAYS_PER_SANDBOX * 4 * bridge.CHUNK
    bound = 2 * (per_session + per_sandbox) + 32 * MIB
    assert seen.rss - rss <= bound, f"worker RSS grew {(seen.rss - rss) / MIB:.0f} MiB, bound {bound / MIB:.0f} MiB"
    assert bridge.WORKER.relays == 0 and bridge.WORKER.unanswered == 0
    assert wait_gone(ALL_SANDBOXES) == []
