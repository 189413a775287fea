"""envrl's policy gradient on a run's own batch against a plain peft + torch gradient computed the
way TRL's GRPOTrainer does (`loss_type = "dapo"`), from the same adapter init.

    python -m scripts.bench.gradient_vs_plain outputs/my_run

Guarantee: nothing under the run directory is written. envrl's side is a Trainer built from the
run's `configs/trainer.toml` (eager, a scratch output dir) training batch `rollouts/step_0/`
once (the one batch sampled by the weights a new trainer starts from); the plain side is the run's base model with a peft LoRA of the same rank, alpha and
targets whose weights are copied from envrl's before its step, and the loss
-sum(advantage * ratio) / (the batch's trained tokens) with ratio = exp(logp - logp.detach())
(on-policy TRL: one over each token, its gradient the policy gradient), one sample at a time.
Prints both losses, both gradient norms, their cosine and the largest relative difference of one
LoRA tensor. The two agree up to float32 summation order (the batch is on-policy: `clip_frac` 0);
a larger difference means envrl trains something other than TRL's objective.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from envrl.config import resolve_config
from envrl.data.layout import batch_dir, process_config_file
from envrl.data.samples import TrainingSample, read_batch
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import Learner
from envrl.trainer.parallel import init_runtime


def layer_key(name: str) -> str:
    """A LoRA parameter's name from its decoder layer on (`3.self_attn.q_proj.lora_A.default.weight`),
    the same under envrl's model and a plain peft model."""
    return name.split("layers.", 1)[1]


def plain_gradients(
    config: TrainerConfig, init: dict[str, torch.Tensor], samples: list[TrainingSample]
) -> tuple[float, dict[str, torch.Tensor]]:
    """TRL's dapo loss and its gradient on `samples`, from LoRA weights `init` (by `layer_key`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = config.lora
    assert lora is not None, "the run trains no LoRA adapter; this check copies one"
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(config.model.name, dtype=torch.float32),
        LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), lora_dropout=0.0, bias="none"
        ),
    )
    params = {layer_key(n): p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(init):
        raise SystemExit(f"the plain model's {len(params)} LoRA tensors are not envrl's {len(init)}")
    with torch.no_grad():
        for key, tensor in init.items():
            params[key].copy_(tensor)
    trained_tokens = sum(sum(s.loss_mask) for s in samples)
    total = 0.0
    for sample in samples:
        ids = torch.tensor([sample.input_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(sample.loss_mask[1:], dtype=torch.float32)
        loss = -(torch.exp(logp - logp.detach()) * sample.advantage * mask).sum() / trained_tokens
        loss.backward()
        total += loss.item()
    return total, {key: p.grad.detach() for key, p in params.items() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.gradient_vs_plain", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run", type=Path, help="a LoRA run's output dir (configs/trainer.toml, rollouts/step_0/)")
    args = parser.parse_args()
    setup_logging(LogConfig(level="WARNING"), process="bench")
    samples = read_batch(batch_dir(args.run, 0))
    with tempfile.TemporaryDirectory(prefix="gradient-vs-plain-") as scratch:
        config = resolve_config(
            TrainerConfig, [process_config_file(args.run, "trainer")], [("compile", "false"), ("output_dir", scratch)]
        )
        trainer = Learner(config, init_runtime(config))
        named = {layer_key(n): p for n, p in trainer.model.named_parameters() if p.requires_grad}
        init = {key: p.detach().clone() for key, p in named.items()}
        stats = trainer.train_on(0, samples, where="rollouts/step_0")
        envrl = {key: p.grad.detach().clone() for key, p in named.items() if p.grad is not None}
    plain_loss, plain = plain_gradients(config, init, samples)
    dot = sum((envrl[k] * plain[k]).sum().item() for k in plain)
    norm_envrl = sum(g.square().sum().item() for g in envrl.values()) ** 0.5
    norm_plain = sum(g.square().sum().item() for g in plain.values()) ** 0.5
    worst = max((((envrl[k] - g).norm() / g.norm()).item(), k) for k, g in plain.items() if g.norm() > 0)
    print(
        f"batch rollouts/step_0: {len(samples)} samples, {stats['loss_tokens']:.0f} trained tokens, clip_frac {stats['clip_frac']:.3g}"
    )
    print(f"loss: envrl {stats['loss']:.7g}, plain {plain_loss:.7g}")
    print(
        f"grad norm (before clipping): envrl {norm_envrl:.7g}, plain {norm_plain:.7g}; cosine {dot / (norm_envrl * norm_plain):.9f}"
    )
    print(f"largest relative difference of one LoRA tensor: {worst[0]:.3g} ({worst[1]})")


if __name__ == "__main__":
    main()
