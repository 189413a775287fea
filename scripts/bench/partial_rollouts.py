"""A weight reload with generations in flight, three ways (`POST /update_weights` `in_flight`).

    uv run --no-sync python -m scripts.bench.partial_rollouts [--batch 8] [--tokens 1000] [--repeats 2]

Starts `inference` on the tiny model as the launcher does. For each way, `--batch` generations of
`--tokens` tokens each (EOS ignored) are started; once vLLM reports them running, the server
reloads a noise-perturbed copy of the weights as policy 1. Printed per way (medians over
`--repeats`): the seconds the reload POST took (with `wait` it waits for the generations to end),
the seconds until every generation was done, the share of their tokens sampled after the reload
(labelled policy 1), and the largest |logprob served - logprob of the policy labelled| over the
tokens before and after the reload, the reference recomputed by transformers in float32 over
the whole context (~1e-6 is exact; more means the token was not sampled by that policy alone).

- `wait`: the generations finish on the old weights, the reload waits for them (today's default).
- `recompute`: they are frozen, their KV cache dropped and recomputed by the new weights, then go
  on (partial rollouts, `orchestrator.partial_rollouts = true`).
- `keep`: frozen with their KV cache, then go on under the new weights over old-weight keys and
  values.

    uv run --no-sync python -m scripts.bench.partial_rollouts --runs RUN_DIR [RUN_DIR ...]

With `--runs`: for finished runs (the smoke config with `orchestrator.partial_rollouts` off and
on), one table row each from its `metrics.jsonl`: step 0's `trainer/mismatch_kl` and its mean
over the run (later steps train on tokens up to `max_async_level` policies old), the mean train
reward of the last 5 steps, and over the run the tokens generated, trained and dropped as stale,
the stale groups, the samples spanning a weight update and the trained tokens by policy lag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import fmean, median

import httpx

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig
from envrl.inference.launch import start
from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.runtime.http import RetryPolicy
from envrl.telemetry.log import LogConfig
from tests.support.served_weights import perturbed_copy, reference_logprobs, running_requests
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

WAYS = ("wait", "recompute", "keep")


async def reload_mid_generation(
    client: InferenceClient, weights: Path, way: str, batch: int, tokens: int
) -> tuple[float, float, list[list[int]], list[TokenCompletion]]:
    """(reload POST s, s until all done, prompts, completions) for one reload under `way`."""
    prompts = [[1, 17 + i, 42, 99, 7] for i in range(batch)]
    sampling = {"max_tokens": tokens, "ignore_eos": True}
    started = time.perf_counter()
    generations = [asyncio.create_task(client.generate(p, {**sampling, "seed": i})) for i, p in enumerate(prompts)]
    async with httpx.AsyncClient() as http:
        while await running_requests(http, client.base_url) < batch:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # some tokens generated before the reload
    t0 = time.perf_counter()
    await client.update_weights(weights, step=1, in_flight=way)
    reload_s = time.perf_counter() - t0
    completions = list(await asyncio.gather(*generations))
    return reload_s, time.perf_counter() - started, prompts, completions


def logprob_errors(
    weights: Path, prompts: list[list[int]], completions: list[TokenCompletion]
) -> tuple[float, float, float]:
    """(share of tokens after the reload, max error before it against the old weights, after it against the new)."""
    old = reference_logprobs(DEFAULT_DIR, completions, prompts)
    new = reference_logprobs(weights, completions, prompts)
    before, after, later, total = [0.0], [0.0], 0, 0
    for completion, ref_old, ref_new in zip(completions, old, new, strict=True):
        steps = completion.policy_steps or [None] * len(completion.completion_ids)
        for served, step, a, b in zip(completion.logprobs, steps, ref_old, ref_new, strict=True):
            (after if step == 1 else before).append(abs(served - (b if step == 1 else a)))
            later += step == 1
            total += 1
    return later / max(total, 1), max(before), max(after)


def run_row(run: Path) -> str:
    """One table row of the finished run in `run` (see the module docstring)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = {m["step"]: m for m in lines if m.get("process") == "orchestrator" and "train/reward" in m}
    kl = {
        m["step"]: m["trainer/mismatch_kl"]
        for m in lines
        if m.get("process") == "trainer" and "trainer/mismatch_kl" in m
    }
    last = [train[step]["train/reward"] for step in sorted(train)[-5:]]
    totals: Counter[str] = Counter()
    for m in train.values():
        totals.update({k: v for k, v in m.items() if k.startswith("tokens/") or k == "samples_spanning_update"})
        totals["trained"] += m["train/trained_tokens"]
    stale_groups = train[max(train)].get("counters/stale_groups", 0)
    lags = " ".join(f"{k.removeprefix('tokens/')}={totals[k]:.0f}" for k in sorted(totals) if "lag_" in k)
    return (
        f"| {run.name} | {kl[0]:.1e} | {fmean(kl.values()):.4f} | {fmean(last):.3f} | {totals['tokens/generated']:.0f} | {totals['trained']:.0f} "
        f"| {totals['tokens/stale']:.0f} | {stale_groups} | {totals['samples_spanning_update']:.0f} | {lags} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", help="summarise these finished runs instead")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/bench/partial_rollouts"))
    args = parser.parse_args()
    if args.runs:
        print("| run | step-0 mismatch KL | mean mismatch KL | reward last 5 | tokens generated | trained | stale | stale groups "
              "| samples spanning an update | trained tokens by lag |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        for run in args.runs:
            print(run_row(run))
        return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = args.output_dir.resolve()
    config = InferenceConfig(
        model=ModelConfig(name=str(DEFAULT_DIR)), output_dir=out, port=port,
        log=LogConfig(level="WARNING", file=out / "logs" / "inference.log"),
    )  # fmt: skip
    child = start(config, log_file=out / "logs" / "inference.stdout.log", ready_timeout=900.0)
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            weights = perturbed_copy(DEFAULT_DIR, Path(tmp) / "step_1")

            async def measure(way: str) -> list[tuple[float, float, float, float, float]]:
                client = InferenceClient(
                    config.base_url, config.model.name, RetryPolicy(max_retries=0, timeout_s=900.0)
                )
                results = []
                try:
                    for _ in range(args.repeats):
                        reload_s, done_s, prompts, completions = await reload_mid_generation(
                            client, weights, way, args.batch, args.tokens
                        )
                        results.append((reload_s, done_s, *logprob_errors(weights, prompts, completions)))
                        await client.update_weights(DEFAULT_DIR)  # back to the base weights
                finally:
                    await client.aclose()
                return results

            for way in WAYS:
                results = asyncio.run(measure(way))
                rows.append((way, *(median(r[i] for r in results) for i in range(5))))
    finally:
        child.stop(grace=30.0)

    print(f"{args.batch} generations x {args.tokens} tokens in flight, tiny model, vLLM-CPU; medians of {args.repeats}")
    print(
        "| in_flight | reload POST (s) | all generations done (s) | tokens after reload | max err before | max err after |"
    )
    print("|---|---|---|---|---|---|")
    for way, reload_s, done_s, share, before, after in rows:
        print(f"| `{way}` | {reload_s:.2f} | {done_s:.2f} | {share:.0%} | {before:.1e} | {after:.1e} |")


if __name__ == "__main__":
    main()
