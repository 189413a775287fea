"""Generation with a LoRA adapter on vLLM-CPU against the base and the adapter merged in.

    uv run --no-sync python -m scripts.bench.lora_generation [--model deps/models/smollm2-135m]
        [--rank 16] [--repeats 3] [--stock]

Starts `inference` as `rl` does for a LoRA run (`enable_lora`, `max_lora_rank`), then times one
batch shaped like the SmolLM2 recipe's step (4 reverse-text prompts x 8 completions of 24
tokens, EOS ignored, seeded) three ways: the base alone, a rank-`--rank` adapter on every decoder
linear module (B drawn at random: peft's B = 0 would compute nothing) hot-loaded through
`/update_weights`, and that adapter merged into a full model reloaded the same way. `--stock`
leaves vLLM's own CPU LoRA ops in place (envrl's plugin otherwise swaps in
`envrl.inference.cpu_lora`), for the before/after of that change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from statistics import median

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig, lora_serving_options
from envrl.inference.cpu_lora import STOCK_ENV
from envrl.inference.launch import start
from envrl.model.inference import InferenceClient
from envrl.telemetry.log import LogConfig
from envrl.trainer.model.lora import export_merged, publish_adapter
from tests.support.ports import free_port

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TEXTS = ["abcdefg", "qwertyui", "zxcvbnmlk", "poiuy"]


def recipe_prompts(model: str) -> list[list[int]]:
    from reverse_text import SYSTEM_PROMPT

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = []
    for text in TEXTS:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts += [list(ids if isinstance(ids, list) else ids["input_ids"])] * 8
    return prompts


def random_adapter(model: str, rank: int, out: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    publish_adapter(peft_model, peft_model.state_dict(), out)
    return out


async def batch_seconds(client: InferenceClient, prompts: list[list[int]], repeats: int) -> float:
    times = []
    for repeat in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        await asyncio.gather(
            *(
                client.generate(p, {"max_tokens": 24, "temperature": 1.0, "ignore_eos": True, "seed": repeat * 100 + i})
                for i, p in enumerate(prompts)
            )
        )
        times.append(time.perf_counter() - start)
    return median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deps/models/smollm2-135m")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="vLLM's own CPU LoRA ops")
    args = parser.parse_args()
    if args.stock:
        os.environ[STOCK_ENV] = "1"
    model = str(Path(args.model).resolve())
    prompts = recipe_prompts(model)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        adapter = random_adapter(model, args.rank, out / "adapter")
        export_merged(model, adapter, out / "merged")
        config = InferenceConfig(
            model=ModelConfig(name=model), output_dir=out, port=free_port(), kv_cache_gib=2,
            vllm={"max_model_len": 512, **lora_serving_options(args.rank)},
            log=LogConfig(level="WARNING", file=out / "logs" / "inference.log"),
        )  # fmt: skip
        child = start(config, log_file=out / "logs" / "inference.stdout.log", ready_timeout=900.0)

        async def measure() -> dict[str, float]:
            client = InferenceClient(config.base_url, config.model.name)
            try:
                seconds = {"base": await batch_seconds(client, prompts, args.repeats)}
                await client.update_weights(adapter, step=1)
                seconds["adapter"] = await batch_seconds(client, prompts, args.repeats)
                await client.update_weights(out / "merged", step=2)
                seconds["merged"] = await batch_seconds(client, prompts, args.repeats)
                return seconds
            finally:
                await client.aclose()

        try:
            seconds = asyncio.run(measure())
        finally:
            child.stop(grace=30.0)
    ops = "vLLM's own" if args.stock else "envrl's grouped (envrl.inference.cpu_lora)"
    print(f"{model}, LoRA rank {args.rank}, CPU LoRA ops: {ops}; {len(prompts)} x 24 tokens, median of {args.repeats}:")
    print(
        ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
        + f"; adapter / base {seconds['adapter'] / seconds['base']:.2f}x"
    )


if __name__ == "__main__":
    main()
