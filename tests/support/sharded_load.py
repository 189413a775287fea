"""One torchrun rank loading a model as the trainer does, measured and checked against the files.

    torchrun --standalone --nproc-per-node 2 -m tests.support.sharded_load MODEL_DIR OUT_DIR [--full] [--then-lora]

Guarantee: each rank writes `OUT_DIR/rank<r>.json` after `build_model`: its peak resident memory
(VmHWM) before and after the load and the growth between them (the peak is reset to the current
resident size just before the load, /proc/self/clear_refs), the bytes of its fp32 shards and of
the full fp32 model, and which checks failed: a parameter that is not a Shard(0) DTensor, a shard
that differs from the file's rows, a tied head that is not the embedding, a rotary `inv_freq`
that is not the config's, LoRA adapters not initialised as peft does (B zero, A drawn). With
`--full` the rank loads as the trainer did before it loaded shards (the whole model from
`from_pretrained`, then sharded): the baseline of scripts/bench/sharded_load.py. With `--then-lora`
it then builds the model again, with LoRA adapters, and writes that load's report to
`OUT_DIR/rank<r>-lora.json` (one start of torch and transformers per rank for both loads).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.tensor import DTensor, Shard
from transformers import AutoModelForCausalLM

from envrl.config import resolve_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.model.loading import checkpoint_index, checkpoint_name, read_rows, shard_rows
from envrl.trainer.parallel import Runtime, build_model, init_runtime, shard_model


def memory_kib(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def checks(model: torch.nn.Module, model_dir: Path) -> list[str]:
    """What is wrong with the loaded model, one line per failed check (empty: all hold)."""
    failed = []
    index = checkpoint_index(model_dir)
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor) or tuple(param.placements) != (Shard(0),):
            failed.append(f"{name} is not a Shard(0) DTensor")
            continue
        local, first = shard_rows(param)
        if "lora_B" in name:
            if local.count_nonzero():
                failed.append(f"{name} is not zero")
        elif "lora_A" in name:
            if not local.count_nonzero() and len(local):
                failed.append(f"{name} was not drawn")
        else:
            rows = read_rows(index[checkpoint_name(name)], checkpoint_name(name), first, first + len(local))
            if not torch.equal(local, rows.to(local.dtype)):
                failed.append(f"{name} differs from the file")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if (
        base.config.tie_word_embeddings
        and base.get_output_embeddings().weight is not base.get_input_embeddings().weight
    ):
        failed.append("lm_head is not tied to the embedding")
    rotary = base.model.rotary_emb
    expected = type(rotary)(config=base.config).inv_freq
    if not torch.equal(rotary.inv_freq, expected):
        failed.append("rotary inv_freq is not the config's")
    return failed


def load(args: argparse.Namespace, lora: bool, runtime: Runtime | None) -> tuple[dict, Runtime]:
    """Build the model of `args.model_dir` (with LoRA adapters if `lora`) on this rank; its report."""
    overrides = [("model.name", str(args.model_dir)), ("output-dir", str(args.out_dir)), ("wandb.mode", "disabled")]
    if lora:
        overrides.append(("lora.rank", "8"))
    config = resolve_config(TrainerConfig, overrides=overrides)
    runtime = runtime or init_runtime(config)
    before = memory_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    if args.full:
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
        shard_model(model, runtime)
    else:
        model = build_model(config, runtime)
    peak = memory_kib("VmHWM")
    full = sum(p.numel() for p in model.parameters()) * 4
    local = sum(shard_rows(p)[0].numel() for p in model.parameters()) * 4
    report = {
        "rank": runtime.rank,
        "rss_before_bytes": before * 1024,
        "peak_bytes": peak * 1024,
        "growth_bytes": (peak - before) * 1024,
        "shard_bytes": local,
        "full_bytes": full,
        "failed": checks(model, args.model_dir),
    }
    return report, runtime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--full", action="store_true", help="load the whole model on every rank, then shard")
    parser.add_argument(
        "--then-lora", action="store_true", help="then load again with LoRA adapters (rank<r>-lora.json)"
    )
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    runtime = None
    for lora, suffix in [(False, ""), *([(True, "-lora")] if args.then_lora else [])]:
        report, runtime = load(args, lora, runtime)
        (args.out_dir / f"rank{runtime.rank}{suffix}.json").write_text(json.dumps(report) + "\n")
        gc.collect()  # the first model's memory, before the next load measures its own
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
