"""Group-relative advantages: centring, std scaling by group or batch, zero-variance groups,
masked truncated rollouts."""

import pytest

from envrl.data.traces import Trace, WireTask
from envrl.orchestrator.advantage import AdvantageConfig, batch_reward_std, group_advantages, trained_rollouts


def test_advantage_is_reward_minus_group_mean() -> None:
    assert group_advantages([1.0, 0.0, 0.5, 0.5], AdvantageConfig()) == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_std_normalisation_divides_by_group_std() -> None:
    # rewards 1, 0: mean 0.5, population std 0.5
    advantages = group_advantages([1.0, 0.0], AdvantageConfig(scale="group"))
    assert advantages == pytest.approx([1.0, -1.0], rel=1e-5)  # divided by 0.5 + eps (1e-6)


def test_zero_variance_group_kept_with_zero_advantage_by_default() -> None:
    assert group_advantages([0.3, 0.3, 0.3], AdvantageConfig(scale="group")) == pytest.approx([0.0, 0.0, 0.0])


def test_zero_variance_group_dropped_when_configured() -> None:
    assert group_advantages([1.0, 1.0], AdvantageConfig(drop_zero_variance=True)) is None
    assert group_advantages([1.0, 0.0], AdvantageConfig(drop_zero_variance=True)) is not None


def test_empty_group_is_dropped() -> None:
    assert group_advantages([], AdvantageConfig()) is None


def test_batch_scaling_divides_every_group_by_the_batch_std() -> None:
    """A group with little spread is not blown up to unit scale as group scaling would."""
    groups = [[1.0, 0.0], [0.6, 0.4]]
    std = batch_reward_std(groups)  # rewards 1, 0, .6, .4: mean .5, variance (.25+.25+.01+.01)/4
    assert std == pytest.approx(0.13**0.5)
    config = AdvantageConfig(scale="batch")
    assert group_advantages(groups[1], config, std) == pytest.approx([0.1 / std, -0.1 / std], rel=1e-5)  # eps 1e-6
    assert group_advantages(groups[1], AdvantageConfig(scale="group")) == pytest.approx([1.0, -1.0], rel=1e-4)


def test_masked_truncated_rollouts_count_in_the_baseline_but_are_not_trained() -> None:
    done, cut = Trace(task=WireTask(idx=0), reward=1.0), Trace(task=WireTask(idx=0), reward=0.0, is_truncated=True)
    advantages = group_advantages([1.0, 0.0], AdvantageConfig())
    assert advantages == pytest.approx([0.5, -0.5])
    assert trained_rollouts([done, cut], advantages, AdvantageConfig(mask_truncated=True)) == [(done, 0.5)]
    assert len(trained_rollouts([done, cut], advantages, AdvantageConfig())) == 2


def test_only_rollouts_with_a_reward_enter_the_baseline_and_it_needs_two() -> None:
    from envrl.data.traces import Error
    from envrl.orchestrator.advantage import baseline

    dead = Trace.from_error(WireTask(idx=0), Error(type="worker_died", message="SIGKILL"))
    scored = [Trace(task=WireTask(idx=0), reward=r) for r in (1.0, 0.0)]
    assert baseline([scored[0], dead, scored[1]]) == scored
    assert baseline([scored[0], dead, dead]) == [], "one rollout with a reward is no baseline"
    assert baseline([scored[0]]) == [scored[0]], "a group of one keeps its rollout (no group to compare with)"
