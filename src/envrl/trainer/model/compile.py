"""`compile_layers` compiles every decoder layer in place (identical layers once, cached per user) or leaves the
model eager and says why in one line; it never fails a run that eager mode would train."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from loguru import logger
from torch import nn

from envrl.trainer.model.head import LogprobHead, compiled_kernels

CompileChoice = Literal["auto"] | bool

CPU_COMPILE_MIN_PARAMS = 50_000_000
"""`auto` compiles on CPU only models at least this large. On CPU inductor writes and builds C++
per kernel: tens of seconds to minutes of start-up on a 2-core box, which a debug model's
sub-second steps never win back (docs/trainer.md, "Compiled decoder layers")."""


@dataclass(frozen=True)
class CompilePlan:
    enabled: bool
    reason: str
    """One line: what `trainer.compile` resolved to and why."""


def compiler_missing(device: torch.device) -> str | None:
    """Why inductor cannot build kernels for `device` here, or None when it can."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "triton is not installed (inductor's GPU code generator)"
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None and shutil.which("c++") is None:
        return f"no C++ compiler ({compiler!r} or 'c++' on PATH; inductor builds CPU kernels with one)"
    return None


def compile_plan(choice: CompileChoice, device: torch.device, num_params: int) -> CompilePlan:
    """What `trainer.compile = choice` means for a model of `num_params` on `device`."""
    if choice is False:
        return CompilePlan(False, "trainer.compile = false: decoder layers run eagerly")
    missing = compiler_missing(device)
    if missing is not None:
        return CompilePlan(False, f"trainer.compile = {choice!r} but {missing}: decoder layers run eagerly")
    if choice == "auto" and device.type == "cpu" and num_params < CPU_COMPILE_MIN_PARAMS:
        return CompilePlan(
            False,
            f"trainer.compile = 'auto': eager on CPU for a model of {num_params / 1e6:.1f}M parameters "
            f"(< {CPU_COMPILE_MIN_PARAMS / 1e6:.0f}M: compiling costs more start-up than it saves); "
            "trainer.compile = true compiles anyway",
        )
    return CompilePlan(True, f"trainer.compile = {choice!r}: each decoder layer compiled (inductor, regional)")


def compile_cache_dir() -> Path:
    """The inductor cache: `$TORCHINDUCTOR_CACHE_DIR` if set, else `$XDG_CACHE_HOME/envrl/inductor`
    (`~/.cache/envrl/inductor`), created private to the user (0700) instead of torch's default
    `/tmp/torchinductor_<user>`, which another local user could create first and fill."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "envrl" / "inductor"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    return directory


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The repeated blocks of an HF causal LM (through a peft wrapper too)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder().layers


def compile_layers(model: nn.Module, plan: CompilePlan) -> int:
    """Compile each decoder layer in place when `plan.enabled` (logging the plan either way);
    returns how many were compiled. Compilation itself happens at the first forward."""
    logger.info(plan.reason)
    if not plan.enabled:
        return 0
    cache = compile_cache_dir()
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    head = model.get_output_embeddings()
    if isinstance(head, LogprobHead):
        head.kernels = compiled_kernels()
    logger.info(
        f"{len(layers)} decoder layers and the logprob head's kernels compile at the first step (inductor cache: {cache})"
    )
    return len(layers)


def is_compiled(model: nn.Module) -> bool:
    return getattr(decoder_layers(model)[0], "_compiled_call_impl", None) is not None


class CompileClock:
    """Reports once how long the first step spent compiling (dynamo + inductor, forward and
    backward graphs), read from torch's own compile-time counters."""

    KEYS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")

    def __init__(self, model: nn.Module) -> None:
        self.pending = is_compiled(model)

    def report(self, step_seconds: float) -> None:
        if not self.pending:
            return
        self.pending = False
        from torch._dynamo.utils import compilation_time_metrics

        spent = sum(sum(compilation_time_metrics.get(key, [])) for key in self.KEYS)
        logger.info(
            f"first step {step_seconds:.1f}s, of which compiling the decoder layers {spent:.1f}s "
            f"(a restart with the same model and shapes reuses {os.environ.get('TORCHINDUCTOR_CACHE_DIR')})"
        )
