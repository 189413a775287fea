"""Packed training throughput: document-masked attention vs a dense-mask pack vs a padded batch.

    .venv/bin/python -m scripts.bench.packing                    # tiny + a wider random model
    .venv/bin/python -m scripts.bench.packing --models '["tiny"]' --reps 3

For each model and sequence-length mix, the same samples are packed once (`pack`, the trainer's
shapes) and each micro-batch is run forward + backward (a cross-entropy on the logits) as:
`document` (the trainer's default on CPU: `document_sdpa`, no T×T mask), `dense` (the packed
row with sdpa and the block-diagonal T×T mask transformers builds from position ids: the trainer
before this path) and `padded` (the micro-batch's samples as a right-padded [S, longest] batch
with an attention mask). Prints tokens/s (real tokens only; best of `reps` after one warm-up,
since other processes on a shared box only ever slow a run down) and the speed-up of `document` over the others.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from envrl.config import BaseConfig, load_config
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.model.attention import DOCUMENT_SDPA
from envrl.trainer.model.layout import PADDING_SLACK
from envrl.trainer.packing import MicroBatch, pack, packed_logits
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

MIXES: dict[str, tuple[int, tuple[int, int], tuple[int, int]]] = {
    # name: (samples, prompt_len range, completion_len range)
    "smoke 16x~40": (16, (20, 30), (8, 24)),
    "short 64x16-96": (64, (8, 32), (8, 64)),
    "medium 16x256-1k": (16, (128, 256), (128, 768)),
    "long-tail 12x64-2k": (12, (32, 64), (32, 1984)),
}


class BenchConfig(BaseConfig):
    models: list[Literal["tiny", "wide"]] = ["tiny", "wide"]
    """`tiny`: deps/models/tiny-chat (hidden 64, 2 layers). `wide`: random Llama, hidden 256,
    4 layers, 4 heads of 64 (attention is a bigger share, so the quadratic term shows)."""
    mixes: list[str] = list(MIXES)
    """Names from MIXES."""
    max_tokens: int = 4096
    """Micro-batch token budget (the trainer's `micro_batch_tokens`)."""
    reps: int = 3
    """Timed forward/backward passes per variant (the best counts), after one warm-up."""
    threads: int = 0
    """torch threads (0: torch's default)."""


def load_model(name: str) -> nn.Module:
    if name == "tiny":
        return AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config)


def padded_logits(model: nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's samples as one right-padded batch: (logits [S, L, V], real-token mask)."""
    rows = mb.input_ids[0].split(list(mb.lengths))
    longest = max(mb.lengths)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits, mask.bool()


def step(model: nn.Module, micro_batches: list[MicroBatch], variant: str) -> None:
    """Forward + backward of every micro-batch, like the trainer's loop (loss summed per row)."""
    model.config._attn_implementation = DOCUMENT_SDPA if variant == "document" else "sdpa"
    for mb in micro_batches:
        if variant == "padded":
            logits, real = padded_logits(model, mb)
            targets = torch.where(real, torch.zeros_like(real, dtype=torch.long), -100)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
        else:
            logits = packed_logits(model, mb)
            loss = F.cross_entropy(logits[:-1], mb.input_ids[0, 1:], reduction="sum")
        loss.backward()


def tokens_per_s(model: nn.Module, micro_batches: list[MicroBatch], variant: str, reps: int) -> float:
    tokens = sum(mb.num_tokens for mb in micro_batches)
    step(model, micro_batches, variant)
    times = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step(model, micro_batches, variant)
        times.append(time.perf_counter() - start)
    return tokens / min(times)


def main() -> None:
    bench = load_config(BenchConfig, prog="scripts/bench/packing.py")
    setup_logging(LogConfig(level="WARNING"), process="bench")
    transformers.utils.logging.disable_progress_bar()
    if bench.threads:
        torch.set_num_threads(bench.threads)
    print(
        f"torch {torch.__version__}, attention padding slack {PADDING_SLACK}, {torch.get_num_threads()} threads, max_tokens {bench.max_tokens}"
    )
    header = ["model", "mix", "tokens", "micro-batches", "document tok/s", "dense tok/s", "padded tok/s"]
    print("| " + " | ".join(header) + " | document / dense | document / padded |")
    print("|" + "---|" * (len(header) + 2))
    for name in bench.models:
        model = load_model(name).train()
        for mix in bench.mixes:
            count, prompt_len, completion_len = MIXES[mix]
            samples = synthetic_samples(count, prompt_len=prompt_len, completion_len=completion_len, seed=1)
            micro_batches = pack(samples, bench.max_tokens, "token")
            rates = {v: tokens_per_s(model, micro_batches, v, bench.reps) for v in ("document", "dense", "padded")}
            tokens = sum(mb.num_tokens for mb in micro_batches)
            cells = [name, mix, tokens, len(micro_batches), *(f"{r:.0f}" for r in rates.values())]
            ratios = [rates["document"] / rates["dense"], rates["document"] / rates["padded"]]
            print(
                "| " + " | ".join(str(c) for c in cells) + " | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
