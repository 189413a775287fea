"""Trainer throughput on long packed rows: tokens/s and MFU of the trainer's own step.

    python -m scripts.bench.trainer_throughput                     # GPU: Qwen3-0.6B shape, 16k-token rows, bf16, FSDP2
    torchrun --nproc-per-node 8 -m scripts.bench.trainer_throughput
    python -m scripts.bench.trainer_throughput --shape qwen3-tiny --seq-len 512 --steps 2   # CPU smoke
    python -m scripts.bench.trainer_throughput --shape smollm2-135m --seq-len 1024 --sample-len 64 --prompt-len 40   # the CPU recipe's step
    python -m scripts.bench.trainer_throughput --carry outputs/gpu-carry   # pure-Python deps for a bare torch box

Guarantee: the timed region is `Learner.train_on` as `rl` runs it (pack, each rank's forward and
backward over its rows, clipping, the AdamW step) on a model built offline; tokens/s and MFU
count every sample whole (a prompt shared by a group, `--group-size`, counts once per sample even
where the trainer computes it once: `computed/step` says what it ran); MFU counts model
FLOPs only, never activation recomputation: 6·N per token, N the parameters that multiply
activations (all but the input embedding; a tied lm_head counted as the matmul it is), plus
causal attention, 6·layers·(heads·head_dim)·s·(s+1) per sample of s tokens (forward QKᵀ and AV,
backward twice that). At Qwen3-0.6B and 16k this is 9.2 GFLOP/token, the count that turns
prime-rl's published 11.9k tok/s on one H100 into its published 11.1% MFU.

Runs from a bare copy of the repo on a machine with torch, transformers, safetensors and
pydantic: `src/` is put on the path, and where loguru, msgpack or tomli_w (the rest of what
envrl's trainer imports) are missing, `outputs/gpu-carry` too (what `--carry` writes; msgpack
without its C extension).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
CARRY_DIR = ROOT / "outputs" / "gpu-carry"
CARRIED = ("loguru", "msgpack", "tomli_w")
"""envrl's trainer imports beyond torch, transformers (and what it needs), safetensors, pydantic."""
PRIME_RL_TOKENS_PER_S = 11_900
"""prime-rl's published RL trainer throughput: Qwen3-0.6B, 16384-token rows, one H100 (FA3, recompute)."""
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "B200": 2250.0}
"""Dense bf16 peak per device, matched by substring of the device name (first match wins)."""


def _paths() -> list[str]:
    """Make envrl importable from a plain repo copy, with the carried folder only where needed;
    return what still cannot be imported."""
    if not importlib.util.find_spec("envrl"):
        sys.path.insert(0, str(ROOT / "src"))
    if CARRY_DIR.is_dir() and not all(importlib.util.find_spec(name) for name in CARRIED):
        sys.path.insert(0, str(CARRY_DIR))
    needed = ("torch", "transformers", "safetensors", "pydantic", *CARRIED)
    return [name for name in needed if not importlib.util.find_spec(name)]


MISSING = _paths()
if MISSING:
    raise SystemExit(
        f"trainer_throughput: cannot import {', '.join(MISSING)}. torch, transformers, safetensors and pydantic "
        f"must be installed; for the rest run `python -m scripts.bench.trainer_throughput --carry {CARRY_DIR.relative_to(ROOT)}` "
        "where envrl is installed and copy that folder along (it is put on the path by itself)"
    )

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from envrl.config import BaseConfig, load_config, resolve_config  # noqa: E402
from envrl.data.layout import weights_dir  # noqa: E402
from envrl.data.samples import TrainingSample, read_batch, write_batch  # noqa: E402
from envrl.telemetry.log import LogConfig, setup_logging  # noqa: E402

try:
    from envrl.trainer.model.compile import decoder_layers, is_compiled
except ImportError:  # an envrl from before issue 38, for a before/after run: PYTHONPATH=<old tree>/src
    decoder_layers = is_compiled = None
from envrl.model.smollm2 import SMOLLM2_CONFIG  # noqa: E402
from envrl.model.tiny import QWEN3_SHAPES, build_qwen3_model, build_tokenizer  # noqa: E402
from envrl.trainer.config import TrainerConfig  # noqa: E402
from envrl.trainer.learner import Learner  # noqa: E402
from envrl.trainer.parallel import Runtime, barrier, init_runtime, shutdown  # noqa: E402
from envrl.trainer.weights import publish_weights  # noqa: E402
from tests.support.samples import synthetic_samples  # noqa: E402

SHAPES = (*QWEN3_SHAPES, "smollm2-135m")


class BenchConfig(BaseConfig):
    shape: str = "qwen3-0.6b"
    """Built with random weights: a `src/envrl/model/tiny.py` Qwen3 shape (`qwen3-0.6b`, or
    `qwen3-tiny` for CPU) or `smollm2-135m` (the CPU recipe's model)."""
    seq_len: int = 16384
    """Tokens of one packed row (the trainer's `micro_batch_tokens`)."""
    sample_len: int | None = None
    """Tokens per sample; default `seq_len`: one sample fills a row, the costliest attention at that
    length. Shorter samples are packed several to a row."""
    prompt_len: int = 256
    """Tokens at the start of each sample that are not trained on (the prompt)."""
    group_size: int = 1
    """Samples per prompt: each run of this many samples begins with the same prompt, as a
    group's rollouts of one task do."""
    share_prefixes: Literal["auto"] | bool = "auto"
    """The trainer's `share_prefixes` (a group's prompt computed once per row; `auto`: with `document_sdpa`)."""
    rows_per_rank: int = 2
    """Packed rows (micro-batches) each rank trains per optimizer step."""
    steps: int = 3
    """Timed steps (the median is reported)."""
    warmup: int = 1
    """Untimed steps first (allocator, kernels)."""
    activation_checkpointing: Literal["auto"] | bool = "auto"
    """The trainer's `activation_checkpointing` (`auto`: recompute only what memory needs)."""
    compile: Literal["auto"] | bool = "auto"
    """The trainer's `compile` (`auto`: compiled decoder layers on GPU and for models of 50M+ on CPU)."""
    attn_implementation: str = "auto"
    """The trainer's `attn_implementation` (`auto`: flash-attn varlen if installed, else document_sdpa)."""
    dtype: str = "auto"
    """The trainer's `dtype` (`auto`: bf16 compute with fp32 master weights on GPU, fp32 on CPU)."""
    peak_tflops: float | None = None
    """Dense peak TFLOP/s of one device for MFU; default from the device name (H100, H200, A100, B200)."""
    publish: bool = True
    """Also time one batch write/read and one weight publish (not part of tokens/s)."""
    output_dir: Path = ROOT / "outputs" / "bench" / "trainer_throughput"
    """Built model (reused while its build record matches) and the run directory."""
    profile: Path | None = None
    """Also profile one more step (torch.profiler) and print its device time grouped by kernel
    class (GEMM, attention, fused/compiled, elementwise, copies and casts, ...); the Chrome trace
    goes to this path."""
    carry: Path | None = None
    """Only copy the pure-Python packages a bare torch machine lacks (`CARRIED`) to this folder, and exit."""


def carry(target: Path) -> None:
    """Copy `CARRIED` from this interpreter without compiled extensions (msgpack falls back to Python)."""
    shutil.rmtree(target, ignore_errors=True)
    for name in CARRIED:
        source = Path(importlib.util.find_spec(name).origin).parent
        shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"copied {', '.join(CARRIED)} to {target} ({size / 1e6:.1f} MB)")


def build_smollm2_model(directory: Path) -> None:
    """SmolLM2-135M's architecture (`src/envrl/model/smollm2.py`'s config) with random bf16
    weights (seed 0) and the tiny tokenizer (ids past its ~1k decode to empty text)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_CONFIG)).to(torch.bfloat16)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory, safe_serialization=True)


def build_once(directory: Path, shape: str, runtime: Runtime) -> None:
    """The offline model of `shape` in `directory`, built by rank 0 unless its build record
    already matches (every rank then reads the same files)."""
    if shape not in SHAPES:
        raise SystemExit(f"--shape {shape!r}: known shapes are {sorted(SHAPES)}")
    builder = "src/envrl/model/tiny.py" if shape in QWEN3_SHAPES else "scripts/bench/trainer_throughput.py"
    record = {"builder": builder, "shape": shape, "seed": 0}
    built = directory / "envrl_build.json"
    if runtime.is_main and not (built.is_file() and json.loads(built.read_text()) == record):
        if shape in QWEN3_SHAPES:
            build_qwen3_model(directory, shape, seed=0)
        else:
            build_smollm2_model(directory)
            built.write_text(json.dumps(record) + "\n")
    barrier(runtime)


def matmul_params(model_name: Path) -> tuple[int, int, int]:
    """(N, layers, heads·head_dim) of the model, counted on the meta device."""
    config = AutoConfig.from_pretrained(model_name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings().weight
    matmul = total if output is embedding else total - embedding.numel()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return matmul, config.num_hidden_layers, config.num_attention_heads * head_dim


def model_flops(samples: list[TrainingSample], n: int, layers: int, attn_width: int) -> float:
    """Training FLOPs of one step on `samples` (the formula in the module docstring)."""
    lengths = [len(s.input_ids) for s in samples]
    return 6.0 * n * sum(lengths) + 6.0 * layers * attn_width * sum(s * (s + 1) for s in lengths)


def peak_tflops(bench: BenchConfig, device: torch.device) -> float | None:
    if bench.peak_tflops is not None or device.type != "cuda":
        return bench.peak_tflops
    name = torch.cuda.get_device_name(device)
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def verdict(bench: BenchConfig, runtime: Runtime, device_name: str, per_gpu: float) -> str:
    """Whether this run is the one the target is stated for, and if so whether it meets it."""
    target = 2 * PRIME_RL_TOKENS_PER_S
    unmet = [
        want
        for want, ok in (
            ("--shape qwen3-0.6b", bench.shape == "qwen3-0.6b"),
            ("--seq-len 16384", bench.seq_len == 16384),
            ("one H100 (cuda)", runtime.device.type == "cuda" and "H100" in device_name and runtime.world_size == 1),
            ("bf16 compute", runtime.compute_dtype == torch.bfloat16),
        )
        if not ok
    ]
    if unmet:
        return f"target (>= {target} tok/s per GPU, 2x prime-rl) not judged: needs {', '.join(unmet)}"
    met = "MET" if per_gpu >= target else "NOT MET"
    return f"target >= {target} tok/s per GPU (2x prime-rl's {PRIME_RL_TOKENS_PER_S}): {met} ({per_gpu:.0f})"


def main() -> None:
    bench = load_config(BenchConfig, prog="python -m scripts.bench.trainer_throughput")
    if bench.carry is not None:
        return carry(bench.carry)
    setup_logging(LogConfig(level="WARNING"), process="bench")
    transformers.utils.logging.disable_progress_bar()
    sample_len = bench.sample_len or bench.seq_len
    if not 0 < bench.prompt_len < sample_len <= bench.seq_len:
        raise SystemExit(
            f"need 0 < prompt_len ({bench.prompt_len}) < sample_len ({sample_len}) <= seq_len ({bench.seq_len})"
        )
    run_dir, model = bench.output_dir / "run", bench.output_dir / f"{bench.shape}-random"
    base = {
        "model": {"name": str(model)},
        "output_dir": str(run_dir),
        "micro_batch_tokens": bench.seq_len,
        "activation_checkpointing": bench.activation_checkpointing,
        "compile": bench.compile,
        "attn_implementation": bench.attn_implementation,
        "share_prefixes": bench.share_prefixes,
        "dtype": bench.dtype,
        "optim": {"lr": 1e-6},
        "wandb": {"mode": "disabled"},
    }
    if is_compiled is None:  # the old trainer: no compile key, recompute a bool (its default off)
        del base["compile"], base["share_prefixes"]
        base["activation_checkpointing"] = bench.activation_checkpointing is True
    config = resolve_config(TrainerConfig, base=base)
    runtime = init_runtime(config)
    try:
        build_once(model, bench.shape, runtime)
        if runtime.is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        barrier(runtime)
        trainer = Learner(config, runtime)
        count = bench.rows_per_rank * runtime.world_size * (bench.seq_len // sample_len)
        n_completion = sample_len - bench.prompt_len
        samples = synthetic_samples(
            count,
            prompt_len=(bench.prompt_len, bench.prompt_len),
            completion_len=(n_completion, n_completion),
            vocab_size=trainer.base_config.vocab_size,
            group_size=bench.group_size,
        )
        results = [trainer.train_on(0, samples, where="synthetic") for _ in range(bench.warmup + bench.steps)]
        timed = results[bench.warmup :]
        io_s = publish_s = None
        if bench.publish:
            start = time.perf_counter()
            samples = read_batch(write_batch(run_dir, 0, samples)) if runtime.is_main else samples
            io_s = time.perf_counter() - start
            start = time.perf_counter()
            publish_weights(trainer.model, trainer.tokenizer, weights_dir(run_dir, 1), runtime, trainer.base_config)
            publish_s = time.perf_counter() - start
        if runtime.is_main:
            report(bench, runtime, trainer, samples, timed, io_s, publish_s, results[0]["step_time_s"])
        if bench.profile is not None:
            profile_step(trainer, samples, bench.profile if runtime.is_main else None)
    finally:
        shutdown(runtime)


KERNEL_CLASSES = (
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa", "varlen")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear")),
    ("compiled (triton/inductor)", ("triton_", "cpp_fused", "compiledfunction")),
    ("copy / cast", ("copy", "_to_copy", "convert", "cast")),
    ("reduction / softmax", ("reduce", "softmax", "logsumexp", "norm", "sum", "mean")),
    (
        "elementwise",
        ("elementwise", "vectorized", "unrolled", "aten::mul", "aten::add", "aten::div", "aten::exp", "silu"),
    ),
    ("communication", ("nccl", "all_gather", "reduce_scatter", "gloo")),
)
"""Substrings of a kernel's (CUDA) or an op's (CPU) name that put its time in a class, first match wins."""


def kernel_class(name: str) -> str:
    lowered = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in lowered for k in keys)), "other")


def profile_step(trainer: Learner, samples: list[TrainingSample], trace: Path | None) -> None:
    """One more `train_on` under torch.profiler; print its self time by kernel class."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.runtime.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        step_s = trainer.train_on(0, samples, where="synthetic")["step_time_s"]
    if trace is None:
        return
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    totals: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        if cuda:
            us = event.self_device_time_total if event.device_type == torch.autograd.DeviceType.CUDA else 0.0
        else:  # CPU: the aten ops' own time (Python and the profiler's wrappers are not kernels)
            us = event.self_cpu_time_total if event.key.startswith("aten::") else 0.0
        if us > 0:
            totals[kernel_class(event.key)] = totals.get(kernel_class(event.key), 0.0) + us
            kernels[event.key] = kernels.get(event.key, 0.0) + us
    busy = sum(totals.values())
    print(
        f"profile of one step ({step_s:.3f}s wall; {'GPU kernel' if cuda else 'aten op self'} time {busy / 1e6:.3f}s, trace {trace}):"
    )
    print("| class | ms | share |\n|---|---|---|")
    for cls, us in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"| {cls} | {us / 1e3:.1f} | {us / busy:.1%} |")
    print("| top kernel | class | ms |\n|---|---|---|")
    for name, us in sorted(kernels.items(), key=lambda item: -item[1])[:15]:
        print(f"| {name[:100]} | {kernel_class(name)} | {us / 1e3:.1f} |")
    print(json.dumps({"profile": {cls: round(us / 1e3, 2) for cls, us in totals.items()}, "step_s": step_s}))


def recomputed_layers(model: torch.nn.Module) -> str:
    """How many decoder layers recompute in backward, e.g. `28/28`."""
    layers = decoder_layers(model)
    return f"{sum(bool(getattr(layer, 'gradient_checkpointing', False)) for layer in layers)}/{len(layers)}"


def report(
    bench: BenchConfig,
    runtime: Runtime,
    trainer: Learner,
    samples: list[TrainingSample],
    timed: list[dict[str, float]],
    io_s: float | None,
    publish_s: float | None,
    first_step_s: float,
) -> None:
    n, layers, width = matmul_params(trainer.config.model.name)
    step_s = statistics.median(r["step_time_s"] for r in timed)
    tokens = timed[0]["tokens"]
    per_gpu = tokens / step_s / runtime.world_size
    flops = model_flops(samples, n, layers, width)
    device_name = torch.cuda.get_device_name(runtime.device) if runtime.device.type == "cuda" else "cpu"
    peak = peak_tflops(bench, runtime.device)
    achieved = flops / step_s / runtime.world_size / 1e12
    row = {
        "shape": bench.shape,
        "device": f"{runtime.world_size}x {device_name}",
        "dtype": str(runtime.compute_dtype).removeprefix("torch."),
        "attention": trainer.model.config._attn_implementation,
        "recompute": recomputed_layers(trainer.model) if decoder_layers else bench.activation_checkpointing is True,
        "compiled": is_compiled(trainer.model) if is_compiled else False,
        "first_step_s": round(first_step_s, 3),
        "seq_len": bench.seq_len,
        "sample_len": bench.sample_len or bench.seq_len,
        "tokens/step": int(tokens),
        "computed/step": int(timed[0].get("computed_tokens", tokens)),
        "step_s": round(step_s, 3),
        "tokens/s": round(tokens / step_s),
        "tokens/s/rank": round(per_gpu),
        "gflop/token": float(f"{flops / tokens / 1e9:.3g}"),
        "tflop/s/rank": float(f"{achieved:.3g}"),
        "mfu": f"{achieved / peak:.1%}" if peak else "n/a (--peak-tflops)",
        "peak_mem_gib": round(max(r["peak_mem_gib"] for r in timed), 2),
        "batch_io_s": None if io_s is None else round(io_s, 3),
        "publish_s": None if publish_s is None else round(publish_s, 3),
    }
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; N = {n / 1e6:.1f}M matmul parameters")
    print("| " + " | ".join(row) + " |")
    print("|" + "---|" * len(row))
    print("| " + " | ".join(str(v) for v in row.values()) + " |")
    print(json.dumps(row))
    print(verdict(bench, runtime, device_name, per_gpu))


if __name__ == "__main__":
    main()
