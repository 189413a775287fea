"""Trainer throughput on synthetic batches: tokens/s, step time and peak memory, as a table.

    .venv/bin/python -m scripts.bench.trainer                        # tiny model, CPU
    .venv/bin/python -m scripts.bench.trainer --model qwen3-0.6b     # GPU only (random weights)
    torchrun --nproc-per-node 8 -m scripts.bench.trainer --model qwen3-0.6b

Times `Trainer.train_on` (pack, forward/backward over micro-batches, optimizer step) after
warm-up steps, plus writing/reading the batch file and publishing the weights once.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
import transformers
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from envrl.config import BaseConfig, load_config, resolve_config
from envrl.layout import weights_dir
from envrl.log import LogConfig, setup_logging
from envrl.samples import read_batch, write_batch
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime, shutdown
from envrl.trainer.weights import publish_weights
from scripts.bench.synthetic import synthetic_samples
from scripts.tiny_model import DEFAULT_DIR


class BenchConfig(BaseConfig):
    model: Literal["tiny", "qwen3-0.6b"] = "tiny"
    """`tiny`: deps/models/tiny-chat. `qwen3-0.6b`: a randomly initialised Qwen3-0.6B-shaped model (GPU only)."""
    samples: int = 64
    """Samples per batch."""
    prompt_len: int = 256
    """Prompt tokens per sample (masked out of the loss)."""
    completion_len: int = 768
    """Completion tokens per sample (trained on)."""
    max_tokens: int = 8192
    """Micro-batch token budget."""
    steps: int = 3
    """Timed steps."""
    warmup: int = 1
    """Untimed steps first."""
    activation_checkpointing: bool = False
    """Recompute activations in backward."""
    attn_implementation: str = "auto"
    """The trainer's `attn_implementation` (`sdpa`: the dense-mask pack the trainer used before `auto`)."""


def qwen3_shaped(directory: Path) -> Path:
    """Qwen3-0.6B's architecture with random weights (no hub needed) and the tiny tokenizer."""
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    AutoTokenizer.from_pretrained(DEFAULT_DIR).save_pretrained(directory)
    return directory


def main() -> None:
    bench = load_config(BenchConfig, prog="python -m scripts.bench.trainer")
    setup_logging(LogConfig(level="WARNING"), process="bench")
    transformers.utils.logging.disable_progress_bar()
    if bench.model == "qwen3-0.6b" and not torch.cuda.is_available():
        raise SystemExit("--model qwen3-0.6b needs a GPU (it is 0.6B parameters of fp32 master weights + AdamW)")
    with tempfile.TemporaryDirectory(prefix="envrl-bench-") as tmp:
        root = Path(tmp)
        model_dir = DEFAULT_DIR if bench.model == "tiny" else qwen3_shaped(root / "model")
        vocab = 1024 if bench.model == "tiny" else 151936
        config = resolve_config(
            TrainerConfig,
            base={
                "model": {"name": str(model_dir)},
                "output_dir": str(root / "run"),
                "max_tokens": bench.max_tokens,
                "activation_checkpointing": bench.activation_checkpointing,
                "attn_implementation": bench.attn_implementation,
                "optim": {"lr": 1e-6},
                "wandb": {"mode": "disabled"},
            },
        )
        runtime = init_runtime(config)
        trainer = Trainer(config, runtime)
        samples = synthetic_samples(
            bench.samples,
            prompt_len=(bench.prompt_len, bench.prompt_len),
            completion_len=(bench.completion_len, bench.completion_len),
            vocab_size=vocab,
        )
        start = time.perf_counter()
        path = write_batch(root / "run", 0, samples)
        samples = read_batch(path)
        batch_io_s = time.perf_counter() - start

        results = [trainer.train_on(0, samples, where="synthetic") for _ in range(bench.warmup + bench.steps)]
        timed = results[bench.warmup :]
        start = time.perf_counter()
        publish_weights(trainer.model, trainer.tokenizer, weights_dir(root / "run", 1), runtime, trainer.base_config)
        publish_s = time.perf_counter() - start
        if runtime.is_main:
            device = torch.cuda.get_device_name() if runtime.device.type == "cuda" else "cpu"
            row = {
                "model": bench.model,
                "attention": trainer.model.config._attn_implementation,
                "device": f"{runtime.world_size}x {device}",
                "dtype": str(runtime.compute_dtype).removeprefix("torch."),
                "tokens/step": int(timed[0]["tokens"]),
                "micro_batches": int(timed[0]["micro_batches"]),
                "tokens/s": round(statistics.median(r["tokens_per_s"] for r in timed)),
                "step_s": round(statistics.median(r["step_time_s"] for r in timed), 3),
                "peak_mem_gib": round(max(r["peak_mem_gib"] for r in timed), 2),
                "batch_io_s": round(batch_io_s, 3),
                "publish_s": round(publish_s, 3),
            }
            print("| " + " | ".join(row) + " |")
            print("|" + "---|" * len(row))
            print("| " + " | ".join(str(v) for v in row.values()) + " |")
            print(json.dumps(row))
        shutdown(runtime)


if __name__ == "__main__":
    main()
