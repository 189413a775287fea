"""Group-relative advantages: a group's baseline holds only its scored, error-free rollouts (too few: not trained
on), and its advantages are their rewards minus the mean, optionally scaled by a reward standard deviation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Literal

from envrl.config import BaseConfig
from envrl.data.traces import Trace

MIN_BASELINE = 2
"""Rollouts with a reward a group needs to be trained on (a baseline of one teaches nothing)."""


def baseline(traces: Sequence[Trace]) -> list[Trace]:
    """The rollouts of a group that enter its baseline (`Trace.in_baseline`), in order; none when
    fewer than `MIN_BASELINE` of them do (or fewer than all of a smaller group's)."""
    good = [t for t in traces if t.in_baseline]
    return good if len(good) >= min(MIN_BASELINE, len(traces)) else []


class AdvantageConfig(BaseConfig):
    scale: Literal["none", "group", "batch"] = "none"
    """What the centred rewards are divided by: nothing (Dr. GRPO), the group's reward standard
    deviation (GRPO), or the standard deviation of every reward in the step's batch (TRL's
    `scale_rewards = "batch"`: groups with little spread are not blown up)."""
    drop_zero_variance: bool = False
    """Leave groups whose rewards are all equal out of the batch (they would train on nothing)."""
    mask_truncated: bool = False
    """Train no sample of a truncated rollout (cut off by `max_tokens`, the episode budget or the
    context); its reward still counts in its group's mean (TRL's `mask_truncated_completions`)."""
    eps: ClassVar[float] = 1e-6
    """Added to a standard deviation before dividing by it (fixed)."""


def _std(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def group_advantages(rewards: list[float], config: AdvantageConfig, batch_std: float = 0.0) -> list[float] | None:
    """Advantages for one group's rewards, or None if the group is dropped; `batch_std` is the
    standard deviation of the step's rewards (`batch_reward_std`), used when `scale = "batch"`."""
    if not rewards:
        return None
    mean = sum(rewards) / len(rewards)
    std = _std(rewards)
    if std <= config.eps and config.drop_zero_variance:
        return None
    scale = {"none": 1.0, "group": std + config.eps, "batch": batch_std + config.eps}[config.scale]
    return [(r - mean) / scale for r in rewards]


def batch_reward_std(groups: Sequence[Sequence[float]]) -> float:
    """The standard deviation of every reward of a step's groups (0 for none)."""
    rewards = [r for group in groups for r in group]
    return _std(rewards) if rewards else 0.0


def trained_rollouts(
    traces: Sequence[Trace], advantages: Sequence[float], config: AdvantageConfig
) -> list[tuple[Trace, float]]:
    """The scored rollouts of a group that become samples, each with its advantage: all of them, or
    with `mask_truncated` the ones that ended by themselves."""
    pairs = zip(traces, advantages, strict=True)
    return [(t, a) for t, a in pairs if not (config.mask_truncated and t.is_truncated)]
