"""The weight hand-off, two ways.

    uv run --no-sync python -m scripts.bench.weights_handoff [--gb 1] [--dir outputs/bench-weights] [--repeats 3]
    uv run --no-sync python -m scripts.bench.weights_handoff --model tiny|smollm2|DIR [--steps 5] [--rank 8]

Without `--model`: seconds per GB of safetensors written as the trainer publishes them (temp dir,
fsync, rename) and read back as a reloading inference server reads them. Point `--dir` at the
shared filesystem a multi-node run would use (docs/scale.md). Before each read the file's pages
are dropped from the page cache (posix_fadvise DONTNEED, no root needed), so the read comes from
the disk or the network filesystem, not from memory.

With `--model`: the seconds per step of the real hand-off, full model against LoRA adapter: the
trainer's `publish_weights` (the full fp32 model, or only the adapter) and the inference server's
`POST /update_weights` (a full reload, or an adapter hot-load), through envrl's own code on a
real vLLM server. `tiny` is the repo's tiny model; `smollm2` is SmolLM2-135M's shape (Llama,
hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate 1536, vocabulary 49152, tied
embeddings), randomly initialised and built once under `--dir` (timings do not depend on the
values); any other value is an HF model directory (e.g. `python scripts/tiny_model.py --shape
qwen3-0.6b` builds Qwen3-0.6B's shape). LoRA: rank `--rank` on every linear module of the decoder layers and on `lm_head`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import time
from pathlib import Path
from statistics import median

import torch
from safetensors.torch import load_file, save_file

from envrl.atomic import atomic_dir

TENSOR_BYTES = 64 * 2**20
"""Size of each tensor (an embedding or a large projection of a ~1B model in bf16)."""
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}


def state_dict(gb: float) -> dict[str, torch.Tensor]:
    count = max(1, round(gb * 1e9 / TENSOR_BYTES))
    return {f"layers.{i}.weight": torch.randn(TENSOR_BYTES // 2, dtype=torch.bfloat16) for i in range(count)}


def drop_cached(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def filesystem(args: argparse.Namespace) -> None:
    state = state_dict(args.gb)
    size_gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    writes, reads = [], []
    for repeat in range(args.repeats):
        final = args.dir / f"step_{repeat}"
        shutil.rmtree(final, ignore_errors=True)
        start = time.perf_counter()
        with atomic_dir(final) as tmp:
            save_file(state, tmp / "model.safetensors")
        writes.append(time.perf_counter() - start)
        drop_cached(final / "model.safetensors")
        start = time.perf_counter()
        loaded = load_file(final / "model.safetensors")
        reads.append(time.perf_counter() - start)
        assert loaded.keys() == state.keys()
        shutil.rmtree(final)
    write_s, read_s = median(writes) / size_gb, median(reads) / size_gb
    print(f"{size_gb:.2f} GB x {args.repeats} in {args.dir}: write+fsync+rename {write_s:.2f} s/GB, "
          f"cold read {read_s:.2f} s/GB, hand-off {write_s + read_s:.2f} s/GB (medians)")  # fmt: skip


def smollm2_shape(out: Path) -> Path:
    """SmolLM2-135M's architecture with random weights and the tiny tokenizer, built once."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from scripts.tiny_model import DEFAULT_DIR

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE, pad_token_id=0, eos_token_id=2, bos_token_id=None))
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(DEFAULT_DIR).save_pretrained(tmp)
    return out


def publish_times(model_dir: Path, run_dir: Path, steps: int, rank: int | None) -> tuple[list[float], float]:
    """Seconds of each `publish_weights` of policies 1..steps, and the size of one in MB."""
    from transformers import AutoConfig, AutoTokenizer

    from envrl.layout import weights_dir
    from envrl.trainer.config import TrainerConfig
    from envrl.trainer.parallel import build_model, init_runtime
    from envrl.trainer.weights import publish_weights

    lora = None if rank is None else {"rank": rank, "alpha": 2 * rank, "target_modules": LORA_TARGETS}
    config = TrainerConfig.model_validate({"model": {"name": str(model_dir)}, "output_dir": str(run_dir), "lora": lora})
    runtime = init_runtime(config)
    model = build_model(config, runtime)
    tokenizer, base_config = AutoTokenizer.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)
    seconds = []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        publish_weights(model, tokenizer, weights_dir(run_dir, step), runtime, base_config)
        seconds.append(time.perf_counter() - start)
    size = sum(f.stat().st_size for f in weights_dir(run_dir, 1).iterdir()) / 1e6
    return seconds, size


def reload_times(model_dir: Path, run_dir: Path, steps: int, rank: int | None) -> list[float]:
    """Seconds of each `POST /update_weights` of policies 1..steps, as the orchestrator sends it."""
    from envrl.config import ModelConfig
    from envrl.http import RetryPolicy
    from envrl.inference.adapter import lora_serving_options
    from envrl.inference.client import InferenceClient
    from envrl.inference.config import InferenceConfig
    from envrl.inference.server import start
    from envrl.layout import weights_dir
    from envrl.log import LogConfig
    from tests.support.ports import free_port

    vllm = {"max_model_len": 512, **(lora_serving_options(rank) if rank is not None else {})}
    config = InferenceConfig(
        model=ModelConfig(name=str(model_dir)), output_dir=run_dir, port=free_port(), vllm=vllm,
        log=LogConfig(file=run_dir / "inference.log"), warmup_requests=0,
    )  # fmt: skip
    child = start(config, log_file=run_dir / "inference.stdout.log", ready_timeout=900)

    async def reload_all() -> list[float]:
        client = InferenceClient(config.base_url, config.model.name, RetryPolicy(max_retries=0, timeout=600.0))
        try:
            seconds = []
            for step in range(1, steps + 1):
                start_s = time.perf_counter()
                await client.update_weights(weights_dir(run_dir, step), step=step)
                seconds.append(time.perf_counter() - start_s)
            return seconds
        finally:
            await client.aclose()

    try:
        return asyncio.run(reload_all())
    finally:
        child.stop(grace=30.0)


def handoff(args: argparse.Namespace) -> None:
    import transformers

    from scripts.tiny_model import DEFAULT_DIR

    transformers.utils.logging.disable_progress_bar()

    named = {"tiny": lambda: DEFAULT_DIR, "smollm2": lambda: smollm2_shape(args.dir / "smollm2-135m-random")}
    model_dir = named[args.model]() if args.model in named else Path(args.model)
    print(f"{args.model} ({model_dir}), {args.steps} steps, medians; publish = trainer's publish_weights, "
          "reload = POST /update_weights until the new policy serves")  # fmt: skip
    for label, rank in (("full model", None), (f"LoRA rank {args.rank} adapter", args.rank)):
        run_dir = args.dir / f"handoff-{model_dir.name}-{'full' if rank is None else 'lora'}"
        shutil.rmtree(run_dir, ignore_errors=True)
        publish, size = publish_times(model_dir, run_dir, args.steps, rank)
        reload = reload_times(model_dir, run_dir, args.steps, rank)
        print(f"  {label:<22} {size:9.1f} MB  publish {median(publish):6.3f} s  reload {median(reload):6.3f} s  "
              f"hand-off {median(publish) + median(reload):6.3f} s/step")  # fmt: skip
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=Path("outputs/bench-weights"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="tiny, smollm2, or an HF model directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    if args.model is None:
        filesystem(args)
    else:
        handoff(args)


if __name__ == "__main__":
    main()
