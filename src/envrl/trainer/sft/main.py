"""`rl sft --config sft.toml`: each step minimises the NLL of the assistant tokens of `batch_size` conversations
with the RL trainer's machinery, publishing `weights/final/` once, complete; a non-finite step stops before the
optimizer."""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
import transformers
from loguru import logger
from pydantic import Field
from transformers import AutoConfig, AutoTokenizer

from envrl.config import BaseConfig, ModelConfig, load_config
from envrl.data.layout import final_weights_dir, metrics_file, process_log_file
from envrl.data.samples import TrainingSample
from envrl.model.chat_tokens import ChatRenderer
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.telemetry.metrics import MetricsSink, WandbConfig
from envrl.telemetry.progress import duration
from envrl.trainer.config import OptimConfig, TrainerConfig
from envrl.trainer.learner import build_optimizer
from envrl.trainer.loss import token_logprobs
from envrl.trainer.packing import SFT_KEYS, MicroBatch, pack, packed_logits, shard, shares_prefixes
from envrl.trainer.parallel import Runtime, all_reduce_sum, build_model, init_runtime, shutdown
from envrl.trainer.sft.data import DemonstrationError, load_demonstrations
from envrl.trainer.weights import publish_weights


class SFTConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    data: Path
    """Demonstrations: a JSONL file, one `{"messages": [...], "tools": [...]}` conversation per
    line (tools optional); only assistant messages are trained on."""
    output_dir: Path = Path("outputs/sft")
    """Writes `weights/final/` (the model to start RL from), `metrics.jsonl` and `logs/`."""
    epochs: int = Field(1, ge=1)
    """Passes over the demonstrations."""
    batch_size: int = Field(16, ge=1)
    """Conversations per optimizer step."""
    seq_len: int = Field(2048, ge=2)
    """A conversation longer than this many tokens is cut (counted; its later tokens are not trained)."""
    micro_batch_tokens: int = Field(4096, ge=1)
    """Token budget of one packed micro-batch (as `trainer.micro_batch_tokens`)."""
    seed: int = 0
    """Seed of the conversation order and of torch."""
    optim: OptimConfig = OptimConfig(lr=2e-5)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto = bfloat16 on GPU (fp32 master weights), float32 on CPU."""
    attn_implementation: str = "auto"
    """As `trainer.attn_implementation`."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward to save memory."""
    compile: Literal["auto"] | bool = "auto"
    """As `trainer.compile`. A short SFT on CPU may spend more compiling than training: SmolLM2's
    first step took 5 min of compiling on the 2-core box, so `--compile false` there."""
    log: LogConfig = LogConfig()
    wandb: WandbConfig = WandbConfig()

    def trainer_config(self, max_steps: int) -> TrainerConfig:
        """The RL trainer's settings this run shares (model building, attention, schedule)."""
        return TrainerConfig(
            model=self.model,
            output_dir=self.output_dir,
            max_steps=max_steps,
            seed=self.seed,
            micro_batch_tokens=self.micro_batch_tokens,
            dtype=self.dtype,
            attn_implementation=self.attn_implementation,
            activation_checkpointing=self.activation_checkpointing,
            compile=self.compile,
            optim=self.optim,
        )


def batches(samples: list[TrainingSample], batch_size: int, epochs: int, seed: int) -> list[list[TrainingSample]]:
    """The run's steps: each epoch a seeded shuffle of every sample, cut into `batch_size` chunks
    (the last chunk of an epoch may be smaller)."""
    steps = []
    for epoch in range(epochs):
        order = list(range(len(samples)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        steps += [[samples[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]
    return steps


class SFTTrainer:
    def __init__(self, config: SFTConfig, runtime: Runtime, steps: int, pad_token_id: int) -> None:
        self.config = config
        self.runtime = runtime
        self.trainer_config = config.trainer_config(steps)
        self.model = build_model(self.trainer_config, runtime)
        optim = config.optim
        self.optimizer, self.scheduler = build_optimizer(self.model.parameters(), optim, steps, runtime.device)
        self.pad_token_id = pad_token_id
        """What inert rows pad with when ranks get unequal micro-batch counts."""

    def step(self, index: int, samples: list[TrainingSample]) -> dict[str, float]:
        """One optimizer step on `samples`; returns loss (mean NLL per assistant token) and accuracy."""
        runtime = self.runtime
        where = f"SFT step {index}"
        share = shares_prefixes(self.model)
        micro_batches = pack(
            samples, self.config.micro_batch_tokens, "token", where, runtime.world_size, SFT_KEYS, share_prefixes=share
        )
        mine = shard(micro_batches, runtime.rank, runtime.world_size, self.pad_token_id)
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(3, dtype=torch.float64, device=runtime.device)  # loss, correct, tokens
        for micro_batch in mine:
            sums += self._forward_backward(micro_batch.to(runtime.device))
        all_reduce_sum(sums, runtime)
        loss, correct, tokens = sums.tolist()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.max_grad_norm)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise RuntimeError(
                f"{where}: loss {loss}, grad norm {grad_norm}: stopped before the optimizer step; lower optim.lr"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        return {"loss": loss, "token_accuracy": correct / max(tokens, 1.0), "grad_norm": grad_norm, "lr": lr}

    def _forward_backward(self, mb: MicroBatch) -> torch.Tensor:
        logits = packed_logits(self.model, mb)
        target = mb.input_ids[0]
        logprobs, _ = token_logprobs(logits, target, mb.temperature)
        loss = -(logprobs * mb.weights)[mb.loss_mask].sum()
        (loss * self.runtime.world_size).backward()
        with torch.no_grad():
            predicted = torch.cat([target[:1], logits[:-1].argmax(-1)])
            correct = (predicted == target)[mb.loss_mask].sum()
        values = [loss.detach(), correct, mb.loss_mask.sum()]
        return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=target.device) for v in values])


def run(config: SFTConfig, runtime: Runtime) -> Path:
    """Fine-tune on `config.data`; returns the published model directory."""
    final = final_weights_dir(config.output_dir)
    if final.exists():
        raise RuntimeError(f"{final} already exists: pick a new output_dir (a finished SFT run is never overwritten)")
    renderer = ChatRenderer(config.model.name)
    samples, stats = load_demonstrations(config.data, renderer, config.seq_len)
    logger.info(
        f"{stats.conversations} conversations from {config.data}: {stats.trained_tokens} assistant tokens to train on"
        + (f"; {stats.truncated} cut at seq_len {config.seq_len}" if stats.truncated else "")
        + (f"; {stats.dropped} left with no assistant token (not trained)" if stats.dropped else "")
    )
    steps = batches(samples, config.batch_size, config.epochs, config.seed)
    sft = SFTTrainer(config, runtime, len(steps), pad_token_id=renderer.tokenizer.pad_token_id or 0)
    metrics = (
        MetricsSink(metrics_file(config.output_dir), config.wandb, process="sft", output_dir=config.output_dir)
        if runtime.is_main
        else None
    )
    started = time.monotonic()
    per_epoch = -(-len(samples) // config.batch_size)
    try:
        for index, batch in enumerate(steps):
            values = sft.step(index, batch)
            if metrics is not None:
                metrics.log(index, {f"sft/{k}": v for k, v in values.items()})
            elapsed = time.monotonic() - started
            eta = elapsed / (index + 1) * (len(steps) - index - 1)
            logger.info(
                f"step {index + 1}/{len(steps)} (epoch {index // per_epoch + 1}/{config.epochs}) | "
                f"loss {values['loss']:.4f} | token accuracy {values['token_accuracy']:.1%} | "
                f"grad_norm {values['grad_norm']:.3g} | lr {values['lr']:.2e} | ETA {duration(eta)}"
            )
    finally:
        if metrics is not None:
            metrics.close()
    base_config = AutoConfig.from_pretrained(config.model.name)
    tokenizer = AutoTokenizer.from_pretrained(config.model.name)
    publish_weights(sft.model, tokenizer, final, runtime, base_config)
    return final


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(SFTConfig, argv, prog="rl sft")
    setup_logging(
        config.log.model_copy(update={"file": config.log.file or process_log_file(config.output_dir, "sft")}), "sft"
    )
    transformers.utils.logging.disable_progress_bar()
    runtime = init_runtime(config.trainer_config(1))
    try:
        final = run(config, runtime)
    except (DemonstrationError, RuntimeError) as e:
        logger.error(f"rl sft stopped: {e}")
        sys.exit(1)
    finally:
        shutdown(runtime)
    logger.success(f"fine-tuned model in {final}; start RL from it with --model.name {final}")
