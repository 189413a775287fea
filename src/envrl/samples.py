"""Training samples: what the orchestrator hands the trainer, one per Trace branch.

Guarantee: every sample's per-token lists have the same length, the loss mask is 0/1, and
inference logprobs are 0 wherever the mask is 0, so the trainer never has to guess alignment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator


class TrainingSample(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    input_ids: list[int]
    loss_mask: list[int]
    """1 for tokens the policy generated (trained on), 0 for prompt and env/tool tokens."""
    inference_logprobs: list[float]
    """Logprob of each token under the policy that sampled it; 0 where `loss_mask` is 0."""
    advantage: float
    env: str
    task_idx: int
    policy_step: int
    """The trainer step whose weights generated this sample (for off-policy bookkeeping)."""

    @model_validator(mode="after")
    def _aligned(self) -> TrainingSample:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.inference_logprobs) != n:
            raise ValueError(
                f"input_ids ({n}), loss_mask ({len(self.loss_mask)}) and inference_logprobs "
                f"({len(self.inference_logprobs)}) must have the same length"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask must hold only 0 and 1")
        if any(lp != 0.0 for lp, m in zip(self.inference_logprobs, self.loss_mask) if m == 0):
            raise ValueError("inference_logprobs must be 0 where loss_mask is 0")
        return self
