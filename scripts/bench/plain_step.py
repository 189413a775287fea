"""A plain transformers + torch training step, the yardstick beside envrl's trainer bench.

    python -m scripts.bench.plain_step                       # GPU: the trainer bench's Qwen3-0.6B model, 2 rows x 16k
    python -m scripts.bench.plain_step --compile             # the same with each decoder layer compiled
    python -m scripts.bench.plain_step --model DIR --seq-len 512 --device cpu   # anywhere

Guarantee: the step is written the way TRL's GRPOTrainer computes one, with nothing of envrl's:
fp32 master weights, bf16 autocast on CUDA, sdpa attention, gradient checkpointing (TRL's
default), the full `[seq, vocab]` fp32 log-softmax gathered at the targets, a masked mean over
the completion tokens, AdamW (fused on CUDA). One sample per row, so no packing. Tokens/s and MFU
use the trainer bench's FLOP count (`scripts/bench/trainer_throughput.py`), so the two benches'
rows compare directly; the model is the one that bench builds (run it first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from scripts.bench.trainer_throughput import PEAK_BF16_TFLOPS, ROOT, matmul_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "outputs/bench/trainer_throughput/qwen3-0.6b-random")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--rows", type=int, default=2, help="rows (micro-batches) per optimizer step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="compile each decoder layer (regional)")
    parser.add_argument("--no-recompute", action="store_true", help="no gradient checkpointing")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(
            f"plain_step: no model at {args.model}; build it with `python -m scripts.bench.trainer_throughput`"
        )
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).train()
    if not args.no_recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.compile:
        for layer in model.model.layers:
            layer.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows = [torch.randint(0, vocab, (1, args.seq_len), generator=generator).to(device) for _ in range(args.rows)]
    mask = torch.zeros(1, args.seq_len - 1, device=device)
    mask[:, args.prompt_len - 1 :] = 1.0

    def step() -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for ids in rows:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(input_ids=ids).logits[:, :-1]
            logprobs = logits.float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -(logprobs * mask).sum() / mask.sum() / len(rows)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first_s = step()
    times = [step() for _ in range(args.warmup - 1 + args.steps)][max(args.warmup - 1, 0) :]
    step_s = statistics.median(times)
    n, layers, width = matmul_params(args.model)
    tokens = args.rows * args.seq_len
    flops = 6.0 * n * tokens + 6.0 * layers * width * args.rows * args.seq_len * (args.seq_len + 1)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)
    achieved = flops / step_s / 1e12
    row = {
        "bench": "plain transformers step",
        "device": name,
        "compiled": args.compile,
        "recompute": not args.no_recompute,
        "first_step_s": round(first_s, 3),
        "step_s": round(step_s, 3),
        "tokens/s": round(tokens / step_s),
        "tflop/s": float(f"{achieved:.3g}"),
        "mfu": f"{achieved / peak:.1%}" if peak else "n/a",
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
