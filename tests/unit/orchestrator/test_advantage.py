"""Group-relative advantages: centring, std normalisation, zero-variance groups."""

import pytest

from envrl.orchestrator.advantage import AdvantageConfig, group_advantages


def test_advantage_is_reward_minus_group_mean() -> None:
    assert group_advantages([1.0, 0.0, 0.5, 0.5], AdvantageConfig()) == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_std_normalisation_divides_by_group_std() -> None:
    # rewards 1, 0: mean 0.5, population std 0.5
    assert group_advantages([1.0, 0.0], AdvantageConfig(std_normalize=True, eps=0.0)) == pytest.approx([1.0, -1.0])


def test_zero_variance_group_kept_with_zero_advantage_by_default() -> None:
    assert group_advantages([0.3, 0.3, 0.3], AdvantageConfig(std_normalize=True)) == pytest.approx([0.0, 0.0, 0.0])


def test_zero_variance_group_dropped_when_configured() -> None:
    assert group_advantages([1.0, 1.0], AdvantageConfig(drop_zero_variance=True)) is None
    assert group_advantages([1.0, 0.0], AdvantageConfig(drop_zero_variance=True)) is not None


def test_empty_group_is_dropped() -> None:
    assert group_advantages([], AdvantageConfig()) is None
