"""The training loop: step n trains on `rollouts/step_<n>/` and publishes `weights/step_<n+1>/`, or stops the run
with an error naming the step and batch; a non-finite loss or gradient never reaches the weights."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from loguru import logger
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from envrl.data.layout import (
    checkpoint_dir,
    checkpoints_root,
    final_weights_dir,
    ledger_file,
    metrics_file,
    weights_dir,
)
from envrl.data.samples import TrainingSample
from envrl.runtime.atomic import write_failure
from envrl.telemetry.ledger import Ledger
from envrl.telemetry.metrics import MetricsSink
from envrl.trainer.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
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
from envrl.trainer.weights import publish_final, weight_publisher
from envrl.transport.batches import BatchReceiver, BatchTimeout, FileBatchReceiver
from envrl.transport.memory import TransferError

if TYPE_CHECKING:
    from envrl.transport.weights import WeightPublisher

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


class Trainer:
    """Owns the model, optimizer and schedule of one run; `run()` trains until `max_steps`."""

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
        self.metrics: MetricsSink | None = None
        self.ledger = Ledger(ledger_file(config.output_dir, "trainer") if runtime.is_main else None, "trainer")
        """The main rank's wait / compute / publish / checkpoint spans."""
        self.batches: BatchReceiver = FileBatchReceiver(config.output_dir, timeout_s=config.batch_timeout_s)
        self.publisher: WeightPublisher = weight_publisher(
            config.weights, config.output_dir, self.tokenizer, runtime, self.base_config, config.ckpt.interval
        )

    def start_step(self) -> int:
        """Load the checkpoint asked for (if any) and return the first step to train."""
        config = self.config
        step = config.ckpt.resume_step
        if step is None and config.resume:
            found = list_checkpoints(config.output_dir)
            if not found:
                logger.warning(
                    f"--resume: no checkpoint under {checkpoints_root(config.output_dir)} (ckpt.interval = {config.ckpt.interval}); "
                    "training again from the initial model on the published batches from step 0"
                )
                return 0
            step = found[-1]
        if step is None:
            return 0
        load_checkpoint(config.output_dir, step, self.model, self.optimizer, self.scheduler, self.runtime)
        return step

    def run(self) -> None:
        config = self.config
        start = self.start_step()
        if self.runtime.is_main:
            self.metrics = MetricsSink(
                metrics_file(config.output_dir),
                config.wandb,
                process="trainer",
                output_dir=config.output_dir,
                config=config.model_dump(mode="json"),
                resume_step=start if config.resume else None,
            )
        try:
            for step in range(start, config.max_steps):
                self.run_step(step)
        finally:
            self.publisher.close()
            if self.metrics is not None:
                self.metrics.close()
            self.ledger.close()

    def run_step(self, step: int) -> dict[str, float]:
        """Wait for batch `step`, train on it, publish weights and (on the interval) a checkpoint."""
        config = self.config
        ledger = self.ledger
        with ledger.span("wait_batch", step):
            try:
                waited = self.batches.wait(step)
            except BatchTimeout as e:
                raise TrainingError(str(e)) from None
        with ledger.span("read_batch", step):
            samples = self.batches.receive(step)
        with ledger.span("compute", step):
            stats = self.train_on(step, samples, where=self.batches.where(step))
        start = time.perf_counter()
        done = step + 1
        target = weights_dir(config.output_dir, done)
        try:
            with ledger.span("publish", step):
                self.publisher.publish(self.model, done, last=done == config.max_steps)
                if done == config.max_steps:  # the run's policy, loadable for good
                    published, target = target, final_weights_dir(config.output_dir)
                    publish_final(config.model.name, published, target, self.runtime, self.lora)
            if config.ckpt.interval and (done % config.ckpt.interval == 0 or done == config.max_steps):
                target = checkpoint_dir(config.output_dir, done)
                with ledger.span("checkpoint", step):
                    save_checkpoint(
                        config.output_dir,
                        done,
                        self.model,
                        self.optimizer,
                        self.scheduler,
                        self.runtime,
                        config.ckpt.keep,
                    )
        except TransferError as e:  # a broadcast of an earlier policy broke
            raise TrainingError(f"step {step}: {e}") from e
        except Exception as e:  # a full disk: OSError, or RuntimeError out of torch's writers
            raise TrainingError(f"step {step}: {write_failure(target, e)}") from e
        stats.update(wait_time_s=waited, publish_time_s=time.perf_counter() - start)
        with ledger.span("log", step):  # the span is written with the next step's (or at close)
            if self.metrics is not None:
                self.metrics.log(step, {f"trainer/{k}": v for k, v in stats.items()})
            logger.info(
                f"step {step}: loss {stats['loss']:.4g}, entropy {stats['entropy']:.3f}, "
                f"mismatch_kl {stats['mismatch_kl']:.2e}, grad_norm {stats['grad_norm']:.3g}, "
                f"{stats['tokens_per_s']:.0f} tok/s, {stats['step_time_s']:.2f}s"
            )
            ledger.flush()
        return stats

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
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.optim.max_grad_norm)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        if not (math.isfinite(totals["loss"]) and math.isfinite(grad_norm)):
            raise TrainingError(
                f"step {step}: loss is {totals['loss']} and grad norm {grad_norm} on batch {where}; stopped "
                f"before the optimizer step, so weights/step_{step} stays the last good policy. "
                "Look for NaN/inf advantages or logprobs in the batch, or lower trainer.optim.lr"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        if runtime.device.type == "cuda":
            torch.cuda.synchronize(runtime.device)
        elapsed = time.perf_counter() - start
        self.compile_clock.report(elapsed)
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
            "micro_batches": len(micro_batches),
            "staleness_max": max(staleness),
            "staleness_mean": sum(staleness) / len(staleness),
            "step_time_s": elapsed,
            "tokens_per_s": totals["tokens"] / elapsed,
            "peak_mem_gib": peak_memory_gib(runtime.device),
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
