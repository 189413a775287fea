"""Clients of the run's own servers send no key, token or secret to another user's listener, nor to a proxy.

Issue 53: `InferenceClient` (generation, model info, reloads with the memory-transfer secret) and
`TeacherClient` sent the run's keys to whoever listened on the port; the replicas' back-check
looked at the listener only after `/health` said 200; every httpx client obeyed `HTTP_PROXY`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web

from envrl.launcher.recovery import ReplicaBack
from envrl.model.inference import InferenceClient
from envrl.orchestrator.teacher import TEACHER_API_KEY_ENV, TeacherClient
from envrl.runtime.http import RetryPolicy
from envrl.runtime.listeners import ForeignListener
from envrl.runtime.process import ChildFailed
from envrl.runtime.secrets import API_KEY_ENV
from tests.support.other_user import needs_root
from tests.support.ports import free_port

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
RECORDING = """
import http.server, sys
class Recording(http.server.BaseHTTPRequestHandler):
    def answer(self):
        print(self.command, self.path, self.headers.get("Authorization"), flush=True)
        self.send_response(503 if self.path == "/health" else 200)
        self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Recording).serve_forever()
"""
"""An HTTP server that prints each request's method, path and Authorization header, and answers
503 to `/health` (still loading, as a squatter would say) and `{}` to anything else."""
FAST = RetryPolicy(max_retries=0, timeout_s=5.0)


@contextmanager
def recording_server(port: int, user: list[str]) -> Iterator[list[str]]:
    """`RECORDING` on 127.0.0.1:`port` run as `user` (argv prefix); the lines it printed, once it is stopped."""
    server = subprocess.Popen([*user, sys.executable, "-c", RECORDING, str(port)], stdout=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(
            ["curl", "-s", "--noproxy", "*", "-o", "/dev/null", f"http://127.0.0.1:{port}/x"], check=False
        ).returncode:
            assert server.poll() is None and time.monotonic() < deadline, "the recording server did not start"
            time.sleep(0.05)
        yield seen
    finally:
        server.kill()
        out, _ = server.communicate()
        seen += [line for line in out.splitlines() if not line.startswith("GET /x ")]


def test_no_client_sends_a_secret_to_another_users_listener_and_the_back_check_names_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_root()
    monkeypatch.setenv(API_KEY_ENV, "the-run-s-api-key")
    monkeypatch.setenv(TEACHER_API_KEY_ENV, "the-teacher-s-key")
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def calls() -> list[str]:
        client = InferenceClient(url, "m", retry=FAST, reload_token="the-run-s-reload-token")
        teacher = TeacherClient(url, "m", FAST)
        refused = []
        attempts = {
            "generate": lambda: client.generate([1, 2], {"max_tokens": 1}),
            "reload": lambda: client.update_weights(tmp_path, step=1, transfer={"secret": "the-transfer-secret"}),
            "weights": client.served_weights,
            "teacher": lambda: teacher.logprobs([1, 2]),
            "ready": lambda: client.wait_until_ready(5.0),
        }
        try:
            for name, attempt in attempts.items():
                with pytest.raises(ForeignListener, match=r"uid 65534\) listens at"):
                    await attempt()
                refused.append(name)
        finally:
            await client.aclose()
            await teacher.aclose()
        return refused

    (tmp_path / "weights" / "step_0").mkdir(parents=True)  # a policy the back-check would load
    with recording_server(port, AS_NOBODY) as seen:
        assert asyncio.run(calls()) == ["generate", "reload", "weights", "teacher", "ready"]
        # a squatter that says "loading" (503) is named at the first poll, not waited on forever
        with pytest.raises(ChildFailed, match=r"uid 65534\) listens at"):
            ReplicaBack(url, "m", tmp_path, token="the-run-s-reload-token")()
    assert seen == [], seen  # not one request reached it


def test_clients_of_the_runs_own_servers_never_go_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """`HTTP_PROXY` names a recording proxy of this user; the run's server is elsewhere. Every call
    reaches the server directly and the proxy sees nothing (not the key, not the token)."""
    monkeypatch.setenv(API_KEY_ENV, "the-run-s-api-key")
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy_port = free_port()
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy_port}")

    async def serve_and_call() -> list[str]:
        served: list[str] = []

        async def answer(request: web.Request) -> web.Response:
            served.append(request.path)
            if request.path == "/health":
                return web.json_response({})
            if request.path == "/v1/models":
                return web.json_response({"data": [{"id": "m", "max_model_len": 64}]})
            if request.path == "/weights":
                return web.json_response({"path": "/w"})
            if request.path == "/update_weights":
                return web.json_response({"status": "ok"})
            ids = (await request.json())["token_ids"][:1]
            choice = {"token_ids": ids, "logprobs": {"content": [{"logprob": -1.0}]}, "finish_reason": "stop"}
            return web.json_response({"choices": [choice]})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", free_port())
        await site.start()
        client = InferenceClient(site.name.rstrip("/"), "m", retry=FAST, reload_token="the-run-s-reload-token")
        try:
            await client.wait_until_ready(10.0)
            await client.generate([1, 2], {"max_tokens": 1})
            await client.served_weights()
            await client.update_weights("/w", step=1)
        finally:
            await client.aclose()
            await runner.cleanup()
        return served

    with recording_server(proxy_port, []) as proxied:
        served = asyncio.run(serve_and_call())
    assert served == ["/health", "/v1/models", "/inference/v1/generate", "/weights", "/update_weights"], served
    assert proxied == [], proxied
