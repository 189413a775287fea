"""The weight hand-off, two ways.

    uv run --no-sync python -m scripts.bench.weights_handoff [--gb 1] [--dir outputs/bench-weights] [--repeats 3]
    uv run --no-sync python -m scripts.bench.weights_handoff --model tiny|smollm2|DIR [--steps 5] [--rank 8]

Without `--model`: seconds per GB of safetensors written as the trainer publishes them (temp dir,
fsync, rename) and read back as a reloading inference server reads them. Point `--dir` at the
shared filesystem a multi-node run would use (docs/scale.md). Before each read the file's pages
are dropped from the page cache (posix_fadvise DONTNEED, no root needed), so the read comes from
the disk or the network filesystem, not from memory.

    uv run --no-sync python -m scripts.bench.weights_handoff --ledger RUN_DIR [RUN_DIR ...]
    uv run --no-sync python -m scripts.bench.weights_handoff --broadcast [--gb 1.2]

With `--model`: the pause per step of the real hand-off, from the trainer's publish until the
replica serves the new policy, through envrl's own code on a real vLLM server: the full model
over `--transport filesystem` (HF safetensors written, then `POST /update_weights` reloads
them) and `memory` (the trainer snapshots the policy, the same POST has the replica receive it
over the gloo engine, no disk), and a LoRA adapter over the filesystem (hot-loaded). `tiny` is the repo's tiny model; `smollm2` is SmolLM2-135M's shape (Llama,
hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate 1536, vocabulary 49152, tied
embeddings), randomly initialised and built once under `--dir` (timings do not depend on the
values); any other value is an HF model directory (e.g. `python -m envrl.model.tiny --shape
qwen3-0.6b` builds Qwen3-0.6B's shape). LoRA: rank `--rank` on every linear module of the decoder layers and on `lm_head`.

With `--broadcast`: the memory transport's own floor, the gloo broadcast of `--gb` GB to one
receiving process with nothing loaded.

With `--ledger`: for finished runs (e.g. the smoke config with each transport), the share of
step time the time ledger gives to the weight publish (trainer) and the reload (replicas).
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

from envrl.model.smollm2 import SMOLLM2_CONFIG
from envrl.runtime.atomic import atomic_dir

TENSOR_BYTES = 64 * 2**20
"""Size of each tensor (an embedding or a large projection of a ~1B model in bf16)."""
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
SMOLLM2_SHAPE = {key: value for key, value in SMOLLM2_CONFIG.items() if key != "architectures"}


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

    from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE, pad_token_id=0, eos_token_id=2, bos_token_id=None))
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(DEFAULT_DIR).save_pretrained(tmp)
    return out


def pause_times(model_dir: Path, run_dir: Path, steps: int, transport: str, rank: int | None) -> dict[str, float]:
    """Medians over policies 1..steps of one trainer and one vLLM server: `publish` (the trainer
    blocked in its publisher), `reload` (the orchestrator's `POST /update_weights`, the replica
    paused) and `pause` (publish start until the replica serves the new policy), and `mb`, what
    one policy is (files written, or bytes broadcast)."""
    from transformers import AutoConfig, AutoTokenizer

    from envrl.config import ModelConfig
    from envrl.data.layout import weights_dir
    from envrl.inference.config import InferenceConfig, lora_serving_options
    from envrl.inference.launch import start
    from envrl.model.inference import InferenceClient
    from envrl.runtime.http import RetryPolicy
    from envrl.telemetry.log import LogConfig
    from envrl.trainer.config import TrainerConfig
    from envrl.trainer.parallel import build_model, init_runtime
    from envrl.trainer.weights import weight_publisher
    from envrl.transport.broadcast import tensor_bytes
    from envrl.transport.memory import read_secret
    from envrl.transport.source import MemoryWeights, read_source, transport_of
    from tests.support.ports import free_port

    vllm = {"max_model_len": 512, **(lora_serving_options(rank) if rank is not None else {})}
    server = InferenceConfig(
        model=ModelConfig(name=str(model_dir)), output_dir=run_dir, port=free_port(), vllm=vllm,
        log=LogConfig(file=run_dir / "inference.log"),
    )  # fmt: skip
    child = start(server, log_file=run_dir / "inference.stdout.log", ready_timeout=900)
    lora = None if rank is None else {"rank": rank, "alpha": 2 * rank, "target_modules": LORA_TARGETS}
    config = TrainerConfig.model_validate(
        {
            "model": {"name": str(model_dir)},
            "output_dir": str(run_dir),
            "lora": lora,
            "weights": {"transport": transport},
        }
    )
    runtime = init_runtime(config)
    model = build_model(config, runtime)
    tokenizer, base_config = AutoTokenizer.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)
    publisher = weight_publisher(config.weights, run_dir, tokenizer, runtime, base_config, files_every=0)

    async def hand_off_all() -> dict[str, list[float]]:
        client = InferenceClient(server.base_url, server.model.name, RetryPolicy(max_retries=0, timeout_s=900.0))
        times: dict[str, list[float]] = {"publish": [], "reload": [], "pause": []}
        try:
            for step in range(1, steps + 1):
                start_s = time.perf_counter()
                publisher.publish(model, step, last=False)
                published_s = time.perf_counter()
                path = weights_dir(run_dir, step)
                transfer = read_secret(path).model_dump() if transport_of(path) == "memory" else None
                await client.update_weights(path, step=step, transfer=transfer)
                done_s = time.perf_counter()
                times["publish"].append(published_s - start_s)
                times["reload"].append(done_s - published_s)
                times["pause"].append(done_s - start_s)
            return times
        finally:
            await client.aclose()

    try:
        times = asyncio.run(hand_off_all())
    finally:
        publisher.close()
        child.stop(grace=30.0)
    first = weights_dir(run_dir, 1)
    if isinstance(source := read_source(first), MemoryWeights):
        size = sum(map(tensor_bytes, source.info.dtype_names, source.info.shapes))
    else:
        size = sum(f.stat().st_size for f in first.iterdir())
    return {name: median(values) for name, values in times.items()} | {"mb": size / 1e6}


def handoff(args: argparse.Namespace) -> None:
    import transformers

    from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

    transformers.utils.logging.disable_progress_bar()

    named = {"tiny": lambda: DEFAULT_DIR, "smollm2": lambda: smollm2_shape(args.dir / "smollm2-135m-random")}
    model_dir = named[args.model]() if args.model in named else Path(args.model)
    print(f"{args.model} ({model_dir}), {args.steps} steps, medians; publish = the trainer blocked in its publisher, "
          "reload = POST /update_weights (the replica paused), pause = publish start until the replica serves "
          "the new policy")  # fmt: skip
    variants = [(transport, "full model", None) for transport in args.transport]
    if args.rank:
        variants.append(("filesystem", f"LoRA rank {args.rank} adapter", args.rank))
    for transport, label, rank in variants:
        run_dir = args.dir / f"handoff-{model_dir.name}-{transport}-{'full' if rank is None else 'lora'}"
        shutil.rmtree(run_dir, ignore_errors=True)
        t = pause_times(model_dir, run_dir, args.steps, transport, rank)
        print(f"  {label:<22} {transport:<10} {t['mb']:9.1f} MB  publish {t['publish']:6.3f} s  "
              f"reload {t['reload']:6.3f} s  pause {t['pause']:6.3f} s/step")  # fmt: skip
        shutil.rmtree(run_dir, ignore_errors=True)


def _receive_only(info_json: str, secret_json: str) -> None:
    """The receiving end of `broadcast_floor`, in a process of its own."""
    from envrl.transport.memory import TransferInfo, TransferSecret
    from tests.unit.transport.receivers import receive

    receive(TransferInfo.model_validate_json(info_json), TransferSecret.model_validate_json(secret_json), 1, 2)


def broadcast_floor(gb: float, repeats: int) -> None:
    """Seconds per GB of the gloo broadcast alone (bf16 tensors, 256 MB buckets, one receiving
    process, nothing loaded): the memory transport's floor on this machine."""
    import multiprocessing

    from envrl.transport.memory import PolicySender

    named = list(state_dict(gb).items())
    size_gb = sum(t.numel() * t.element_size() for _, t in named) / 1e9
    seconds = []
    for _ in range(repeats):
        sender = PolicySender(
            1, named, backend="gloo", host="127.0.0.1", timeout_s=600.0, bucket_bytes=256 * 2**20,
            publish=lambda content, secret: None,
        )  # fmt: skip
        receiver = multiprocessing.get_context("spawn").Process(
            target=_receive_only, args=(sender.info.model_dump_json(), sender.secret.model_dump_json())
        )
        receiver.start()
        assert sender.sending.wait(600)
        start = time.perf_counter()
        assert sender.served.wait(600)
        seconds.append(time.perf_counter() - start)
        receiver.join()
        sender.close()
    print(f"gloo broadcast alone, {size_gb:.2f} GB x {repeats}: {median(seconds) / size_gb:.2f} s/GB "
          "(median, from the group's forming to the last byte)")  # fmt: skip


def ledger_shares(run_dirs: list[Path]) -> None:
    """For each run dir: the median step's wall time and the shares of it the ledger gives to
    the weight hand-off (`publish` on the trainer, `reload_weights` on the replicas)."""
    from envrl.report.timeline import step_splits
    from envrl.telemetry.ledger import read_ledger

    for run_dir in run_dirs:
        splits = step_splits(read_ledger(run_dir))[1:]  # step 0 includes start-up
        wall = sum(s.wall for s in splits)
        publish = sum(s.parts["publish"] for s in splits) / wall
        reload = sum(s.parts["reload_weights"] for s in splits) / wall
        print(f"{run_dir}: {len(splits)} steps, median step {median(s.wall for s in splits):.3f} s; "
              f"weight publish {publish:.1%}, weight reload {reload:.1%}, together {publish + reload:.1%} of step time")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=Path("outputs/bench-weights"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="tiny, smollm2, or an HF model directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank of the adapter line (0: none)")
    parser.add_argument("--transport", nargs="+", default=["filesystem", "memory"], choices=["filesystem", "memory"])
    parser.add_argument("--broadcast", action="store_true", help="the gloo broadcast alone, --gb GB of tensors")
    parser.add_argument(
        "--ledger", type=Path, nargs="+", default=None, help="run dirs: the hand-off's share of step time"
    )
    args = parser.parse_args()
    if args.ledger is not None:
        ledger_shares(args.ledger)
    elif args.broadcast:
        broadcast_floor(args.gb, args.repeats)
    elif args.model is None:
        filesystem(args)
    else:
        handoff(args)


if __name__ == "__main__":
    main()
