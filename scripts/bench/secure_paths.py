"""The hot paths the third hostile review's fixes sit on: sandbox start, a verdict run, a client request.

    uv run --no-sync python -m scripts.bench.secure_paths [--rounds 20] [--requests 200]

Prints, each as p50/p99 in milliseconds: a bubblewrap sandbox's start (create until its agent
answers), a verdict (the final program written and run in a clean room: `Sandbox.verdict`, or on
a tree without it `write_file` + `run(isolate=True)`), and requests of `InferenceClient` to a
loopback server in this process: `generate` on a kept-alive connection, a new client's first
request (`GET /v1/models`, on a new connection), and `served_weights` (the httpx client of reloads).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiohttp import web

from envrl.model.inference import InferenceClient
from envrl.sandbox import BubblewrapProvider, Sandbox, SandboxConfig

PROGRAM = "print(sum(range(10)))\n"


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  (n={len(ordered)})"


async def verdict(box: Sandbox) -> str:
    if hasattr(box, "verdict"):
        result = await box.verdict(["python3", "final.py"], {"final.py": PROGRAM}, timeout=10.0)
    else:
        await box.write_file("final.py", PROGRAM)
        result = await box.run(["python3", "final.py"], timeout=10.0, isolate=True)
    return result.stdout


async def sandbox_paths(rounds: int) -> None:
    provider, config = BubblewrapProvider(), SandboxConfig()
    starts, verdicts = [], []
    for _ in range(rounds):
        begun = time.perf_counter()
        box = await provider.create(config)
        starts.append(time.perf_counter() - begun)
        try:
            await box.run("sleep 30 &")  # something the verdict must outlive
            begun = time.perf_counter()
            assert (await verdict(box)).strip() == "45"
            verdicts.append(time.perf_counter() - begun)
        finally:
            await box.close()
    print(f"sandbox start      {percentiles(starts)}")
    print(f"verdict run        {percentiles(verdicts)}")


async def _generate(request: web.Request) -> web.Response:
    body = await request.json()
    ids = body["token_ids"][:4]
    content = [{"logprob": -0.5} for _ in ids]
    return web.json_response(
        {"choices": [{"token_ids": ids, "logprobs": {"content": content}, "finish_reason": "stop"}]}
    )


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})


async def _weights(request: web.Request) -> web.Response:
    return web.json_response({"path": "/weights"})


async def client_paths(requests: int) -> None:
    app = web.Application()
    app.router.add_post("/inference/v1/generate", _generate)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/weights", _weights)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    try:
        client = InferenceClient(url, "m")
        kept, fresh, reloads = [], [], []
        for _ in range(requests):
            begun = time.perf_counter()
            await client.generate([1, 2, 3], {"max_tokens": 4})
            kept.append(time.perf_counter() - begun)
        await client.aclose()
        for _ in range(requests):
            client = InferenceClient(url, "m")
            begun = time.perf_counter()
            await client.max_model_len()  # the first request of a client: on a new connection
            fresh.append(time.perf_counter() - begun)
            await client.aclose()
        client = InferenceClient(url, "m")
        for _ in range(requests):
            begun = time.perf_counter()
            await client.served_weights()
            reloads.append(time.perf_counter() - begun)
        await client.aclose()
    finally:
        await runner.cleanup()
    print(f"generate, kept     {percentiles(kept)}")
    print(f"first request, new connection {percentiles(fresh)}")
    print(f"served_weights     {percentiles(reloads)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="sandboxes started (each runs one verdict)")
    parser.add_argument("--requests", type=int, default=200, help="client requests per kind")
    args = parser.parse_args()
    asyncio.run(sandbox_paths(args.rounds))
    asyncio.run(client_paths(args.requests))


if __name__ == "__main__":
    main()
