"""Trainer config: a validated `TrainerConfig` is self-consistent, so the loop never re-checks its options; `model`,
`output_dir`, `max_steps` and `max_async_level` are the keys `RLConfig` shares with every process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from envrl.config import BaseConfig, RunKeys
from envrl.telemetry.log import LogConfig
from envrl.telemetry.metrics import WandbConfig
from envrl.transport.config import WeightsConfig


class OptimConfig(BaseConfig):
    lr: float = Field(1e-6, gt=0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 to `lr` over this many steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: keep `lr`, or decay it along a cosine to `min_lr_ratio * lr` at `max_steps`."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Floor of the cosine schedule as a fraction of `lr`."""


class LossConfig(BaseConfig):
    """Token-level policy gradient with importance ratio exp(logp_train - logp_inference)."""

    clip: tuple[float, float] | Literal[False] = (0.2, 0.2)
    """PPO-style clipping, (low, high) distances: the ratio is clipped to [1 - low, 1 + high] in a
    pessimistic min. `false`: no clipping (not None: TOML has no null, and a config written for a
    process leaves None out, which would turn clipping back on)."""
    ratio_mask: tuple[float, float] | None = None
    """IcePop/DPPO-style, (low, high) ratios, e.g. [0.5, 2.0]: tokens whose ratio is outside
    [low, high] get no gradient. Unset: every token is trained."""
    normalize: Literal["token", "sequence"] = "token"
    """`token`: sum over the batch's loss tokens / their count. `sequence`: mean over samples of
    each sample's token mean."""
    ratio_level: Literal["token", "sequence"] = "token"
    """`token`: each token's own ratio. `sequence` (GSPO; TRL's `importance_sampling_level =
    "sequence"`): every trained token of a sample gets the sample's ratio exp(mean of its tokens'
    log-ratios), clipped and masked as a whole (GSPO clips at ~3e-4/4e-4: set `clip`)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty (k3 estimator) pulling the trainer towards the inference policy."""
    ref_kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty (k3 estimator) pulling the policy towards the reference model, the
    initial `model.name` kept frozen (TRL's `beta`). Above 0 the trainer holds a second copy of
    the model and runs one more forward pass per micro-batch; metric `trainer/ref_kl`."""

    @field_validator("clip", "ratio_mask", mode="before")
    @classmethod
    def _off(cls, value: object, info: ValidationInfo) -> object:
        if value is True:
            example = "[0.2, 0.2]" if info.field_name == "clip" else "[0.5, 2.0]"
            raise ValueError(f"give the (low, high) pair, e.g. {example}; false turns it off")
        if value is False or value is None:
            return False if info.field_name == "clip" else None
        return value

    @model_validator(mode="after")
    def _ordered(self) -> LossConfig:
        if self.clip is not False and not (0 <= self.clip[0] <= 1 and self.clip[1] >= 0):
            raise ValueError(f"clip = {list(self.clip)}: low must be in [0, 1] and high >= 0")
        if self.ratio_mask is not None and not 0 <= self.ratio_mask[0] < self.ratio_mask[1]:
            raise ValueError(f"ratio_mask = {list(self.ratio_mask)}: needs 0 <= low < high")
        return self


class LoraConfig(BaseConfig):
    """LoRA through `peft`: the base model stays frozen and only low-rank adapters train."""

    rank: int = Field(8, ge=1, le=512)
    """Adapter rank r. vLLM serves it with `max_lora_rank` = the smallest rank it supports that
    is >= r (1, 8, 16, 32, 64, 128, 256, 320, 512), which `rl` sets."""
    alpha: float = Field(16.0, gt=0)
    """Scaling numerator: the adapter's update is multiplied by alpha / rank."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Names of the decoder layers' linear modules that get adapters (the last part of the module
    name, as in peft), and `lm_head` for the output projection; each must exist in the model,
    checked before training starts."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training. Above 0 the trainer's logprobs are those of
    a perturbed policy, so the importance ratio is no longer 1 on-policy: leave it 0 for RL."""

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("names no module: list the linear layers to adapt, e.g. ['q_proj', 'v_proj']")
        return value


class CheckpointConfig(BaseConfig):
    interval: int = Field(10, ge=0)
    """Save model + optimizer + scheduler + RNG every this many steps, and after the last one.
    A resume restarts the trainer from the newest checkpoint and trains the published batches
    after it again, so this bounds the steps retrained (0: never; a resume retrains from step 0)."""
    keep: int = Field(2, ge=1)
    """Keep the newest this many checkpoints; older ones are deleted after a save succeeds."""
    resume_step: int | None = Field(None, ge=0)
    """Resume from `checkpoints/step_<resume_step>/` (an error if it is missing)."""


class TrainerConfig(RunKeys):
    resume: bool = False
    """Continue from the newest checkpoint in `output_dir` (start fresh if there is none)."""
    seed: int = 0
    """Seed of the torch RNGs (restored from checkpoints on resume)."""
    micro_batch_tokens: int = Field(4096, ge=1)
    """Token budget of one packed micro-batch. Each step packs its batch into as few
    micro-batches as fit this budget (a multiple of the number of ranks), filled longest sample
    first into the emptiest so they come out about equal; a longer sample gets a micro-batch of
    its own. With document-masked attention the cost per token does not grow with the budget:
    it bounds memory (activations and [tokens, vocab] logits grow linearly with it)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto = bfloat16 on GPU (fp32 master weights), float32 on CPU."""
    attn_implementation: str = "auto"
    """`auto`: on CUDA in bf16, `flash_attention_2` (varlen) when flash-attn is installed, else
    envrl's `document_varlen` (torch.nn.attention.varlen: one kernel call per packed row over its
    cumulative sample lengths); on CPU or in fp32 envrl's `document_sdpa` (causal sdpa per group
    of similar-length samples, no T×T mask). Any name transformers knows is passed through
    (`sdpa`, `eager`: dense T×T mask over the packed row; `flex_attention`: GPU only, torch has
    no flex backward on CPU). All keep packed samples apart."""
    share_prefixes: Literal["auto"] | bool = "auto"
    """Compute the untrained tokens a group's samples begin with (its prompt) once per micro-batch,
    exactly. `auto`: under envrl's `document_sdpa` attention (CPU, fp32); `true`: under
    `document_varlen` (GPUs) too, not yet measured there (docs/trainer.md, Shared prefixes)."""
    phase_threads: bool = False
    """On one CPU process: compute with every usable core while the orchestrator waits for this
    step's weights (it has published the newest batch the async bound allows, so vLLM idles)
    and no other thread on the machine is runnable, else with the start-up count
    (OMP_NUM_THREADS, one beside vLLM on a CPU box). Checked before each micro-batch's forward
    and backward, so the switch needs more than one micro-batch a step (`micro_batch_tokens`) to happen
    mid-step. No effect on GPUs or ranks."""
    activation_checkpointing: Literal["auto"] | bool = "auto"
    """Recompute decoder layers' activations in backward to save memory: `true` every layer,
    `false` none, `auto` none when every layer's activations at `micro_batch_tokens` fit the
    device's free memory, else every k-th layer with the largest k that fits, else every layer
    (the estimate: `envrl.trainer.model.recompute`; the choice is logged at start-up)."""
    compile: Literal["auto"] | bool = "auto"
    """Compile each decoder layer (`torch.compile`, regional: identical layers compile once; the
    inductor cache under `~/.cache/envrl/inductor`, so a restart reuses it). `auto`: on GPU, and
    on CPU for models of 50M parameters or more (a debug model's start-up would pay more than it
    saves). Without a compiler (triton on GPU, a C++ compiler on CPU) the layers run eagerly,
    with one log line saying so."""
    batch_timeout_s: float = Field(3600.0, gt=0)
    """Fail if `rollouts/step_<n>/` has not appeared this long after the trainer started waiting."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (None: full fine-tuning). Each step then
    publishes only the adapter, which the inference server hot-loads onto the base model it
    keeps; the KL to the reference (`loss.ref_kl_coef`) uses the base with the adapter off."""
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    ckpt: CheckpointConfig = CheckpointConfig()
    weights: WeightsConfig = WeightsConfig()
    """How each step's policy reaches the inference replicas (envrl.transport.weights)."""
    log: LogConfig = LogConfig()
    wandb: WandbConfig = WandbConfig()
