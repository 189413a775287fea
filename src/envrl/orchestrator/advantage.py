"""Group-relative advantages.

Guarantee: a group's advantages are its rewards minus the group mean (optionally divided by the
group's standard deviation), in the group's order; a group whose rewards are all equal carries
no learning signal and is either kept with zero advantages or dropped, as configured.
"""

from __future__ import annotations

import math

from pydantic import BaseModel


class AdvantageConfig(BaseModel):
    std_normalize: bool = False
    """Divide by the group's reward standard deviation (GRPO style) as well as centring."""
    drop_zero_variance: bool = False
    """Leave groups whose rewards are all equal out of the batch (they would train on nothing)."""
    eps: float = 1e-6


def group_advantages(rewards: list[float], config: AdvantageConfig) -> list[float] | None:
    """Advantages for one group's rewards, or None if the group is dropped."""
    if not rewards:
        return None
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std <= config.eps and config.drop_zero_variance:
        return None
    scale = std + config.eps if config.std_normalize else 1.0
    return [(r - mean) / scale for r in rewards]
