"""One optimizer step of the policy (model, reference, optimizer, schedule, loss): `train_on` either steps the
optimizer or raises `TrainingError` naming the step and the batch, before a non-finite loss or gradient reaches the
weights."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from envrl.data.samples import TrainingSample
from envrl.trainer.config import OptimConfig, TrainerConfig
from envrl.trainer.loss import policy_loss
from envrl.trainer.model.compile import CompileClock
from envrl.trainer.model.lora import is_lora
from envrl.trainer.packing import MicroBatch, pack, packed_token_logprobs, shard, shares_prefixes
from envrl.trainer.parallel import (
    Runtime,
    all_reduce_sum,
    build_model,
    build_reference,
    hold_gathered,
    phase_threads,
)

SUMS = (
    "loss",
    "loss_tokens",
    "entropy",
    "mismatch_kl",
    "ref_kl",
    "clipped",
    "masked",
    "tokens",
    "computed_tokens",
    "samples",
)


class TrainingError(RuntimeError):
    """The run cannot go on; the message names the step, the batch and what to do."""


def lr_factor(step: int, optim: OptimConfig, max_steps: int) -> float:
    """Multiplier of `optim.lr` for optimizer step `step` (0-based): linear warm-up, then the schedule."""
    if step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return 1.0
    progress = (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps)
    return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(
    params: Iterable[nn.Parameter], optim: OptimConfig, max_steps: int, device: torch.device
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its schedule (`lr_factor`). On CUDA the fused kernel: one launch
    per parameter group instead of a chain of multi-tensor ones, the same update."""
    optimizer = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=device.type == "cuda" or None,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, optim, max_steps))


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Learner:
    """The policy a run trains and how one batch moves it; built from the config, nothing else."""

    def __init__(self, config: TrainerConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.base_config = AutoConfig.from_pretrained(config.model.name)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.name)
        self.pad_token_id = self.tokenizer.pad_token_id or 0
        self.model = build_model(config, runtime)
        self.lora = is_lora(self.model)
        with_reference = config.loss.ref_kl_coef > 0
        self.reference = build_reference(config, runtime) if with_reference and not self.lora else None
        """The frozen initial model the `ref_kl_coef` penalty pulls towards (None without one, and
        with LoRA, whose reference is `self.model` with the adapter disabled)."""
        self.with_reference = with_reference
        self.share_prefixes = shares_prefixes(self.model, config.share_prefixes)
        """Whether micro-batches compute a group's common prefix once (`packing.pack`)."""
        optim = config.optim
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_optimizer(trainable, optim, config.max_steps, runtime.device)
        self.compile_clock = CompileClock(self.model)
        """Reports the first step's compile time once (a no-op for an eager model)."""
        self.threads = phase_threads(config, runtime)
        """Torch threads that follow generation's phase (None: the start-up count throughout)."""

    def _check_staleness(self, step: int, samples: list[TrainingSample], where: str) -> list[int]:
        staleness = [step - s.policy_step for s in samples]
        bad = [i for i, lag in enumerate(staleness) if lag < 0 or lag > self.config.max_async_level]
        if bad:
            s = samples[bad[0]]
            raise TrainingError(
                f"step {step}: sample {bad[0]} of {where} comes from policy {s.policy_step}, outside "
                f"[{step - self.config.max_async_level}, {step}] (max_async_level = {self.config.max_async_level}); "
                f"the orchestrator broke the off-policy bound ({len(bad)} such samples)"
            )
        return staleness

    def train_on(self, step: int, samples: list[TrainingSample], where: str) -> dict[str, float]:
        """One optimizer step on `samples` (this rank trains its share); returns the step's metrics."""
        config, runtime = self.config, self.runtime
        staleness = self._check_staleness(step, samples, where) if samples else [0]
        micro_batches = pack(
            samples,
            config.micro_batch_tokens,
            config.loss.normalize,
            where,
            runtime.world_size,
            share_prefixes=self.share_prefixes,
        )
        mine = shard(micro_batches, runtime.rank, runtime.world_size, self.pad_token_id)
        if runtime.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(runtime.device)
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(len(SUMS), dtype=torch.float64, device=runtime.device)
        for i, micro_batch in enumerate(mine):
            hold_gathered(self.model, runtime, more_micro_batches=i < len(mine) - 1)
            sums += self._forward_backward(step, micro_batch.to(runtime.device))
        all_reduce_sum(sums, runtime)
        totals = dict(zip(SUMS, sums.tolist(), strict=True))
        grad_norm = self._finite_grad_norm(step, totals["loss"], where)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        if runtime.device.type == "cuda":
            torch.cuda.synchronize(runtime.device)
        elapsed = time.perf_counter() - start
        self.compile_clock.report(elapsed)
        return self._metrics(totals, grad_norm, lr, len(micro_batches), staleness, elapsed)

    def _finite_grad_norm(self, step: int, loss: float, where: str) -> float:
        """The gradient's norm, clipped; `TrainingError` before the optimizer step if it or the loss is not finite."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise TrainingError(
                f"step {step}: loss is {loss} and grad norm {grad_norm} on batch {where}; stopped "
                f"before the optimizer step, so weights/step_{step} stays the last good policy. "
                "Look for NaN/inf advantages or logprobs in the batch, or lower trainer.optim.lr"
            )
        return grad_norm

    def _metrics(
        self,
        totals: dict[str, float],
        grad_norm: float,
        lr: float,
        micro_batches: int,
        staleness: list[int],
        elapsed: float,
    ) -> dict[str, float]:
        """The step's metrics line: per-token means over the trained tokens, counts and timings."""
        n = max(totals["loss_tokens"], 1.0)
        return {
            "loss": totals["loss"],
            "entropy": totals["entropy"] / n,
            "mismatch_kl": totals["mismatch_kl"] / n,
            **({"ref_kl": totals["ref_kl"] / n} if self.with_reference else {}),
            "clip_frac": totals["clipped"] / n,
            "mask_frac": totals["masked"] / n,
            "grad_norm": grad_norm,
            "lr": lr,
            "samples": totals["samples"],
            "tokens": totals["tokens"],
            "computed_tokens": totals["computed_tokens"],
            "loss_tokens": totals["loss_tokens"],
            "micro_batches": micro_batches,
            "staleness_max": max(staleness),
            "staleness_mean": sum(staleness) / len(staleness),
            "step_time_s": elapsed,
            "tokens_per_s": totals["tokens"] / elapsed,
            "peak_mem_gib": peak_memory_gib(self.runtime.device),
        }

    @contextmanager
    def _reference_model(self) -> Iterator[nn.Module]:
        """The reference policy: the frozen copy, or with LoRA the base model (adapter disabled)."""
        if self.reference is not None:
            yield self.reference
            return
        with self.model.disable_adapter():
            yield self.model

    def _follow_phase(self, step: int) -> None:
        if self.threads is not None:
            self.threads.follow(step)

    def _forward_backward(self, step: int, mb: MicroBatch) -> torch.Tensor:
        """Loss and backward on one micro-batch of `step`; returns its sums in `SUMS` order."""
        self._follow_phase(step)
        logprobs, entropy = packed_token_logprobs(self.model, mb)
        ref_logprobs = None
        if self.with_reference:
            with torch.no_grad(), self._reference_model() as reference:
                ref_logprobs, _ = packed_token_logprobs(reference, mb)
        loss, stats = policy_loss(
            logprobs,
            mb.inference_logprobs,
            mb.advantages,
            mb.loss_mask,
            mb.weights,
            self.config.loss,
            ref_logprobs,
            mb.lengths,
        )
        self._follow_phase(step)
        # FSDP averages gradients over ranks; the weights already normalise over the whole batch.
        (loss * self.runtime.world_size).backward()
        tokens, computed = (float(mb.sample_tokens), float(mb.num_tokens)) if mb.num_samples else (0.0, 0.0)
        values = [
            loss.detach(),
            stats["loss_tokens"],
            torch.where(mb.loss_mask, entropy, 0.0).sum(),
            stats["mismatch_kl"],
            stats["ref_kl"],
            stats["clipped"],
            stats["masked"],
            tokens,
            computed,
            float(mb.num_samples),
        ]
        return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=mb.input_ids.device) for v in values])
