"""Each loss option against values worked out by hand on four tokens."""

import math
import tomllib

import pytest
import torch

from envrl.config import ConfigError, config_to_toml, resolve_config
from envrl.trainer.config import LossConfig, TrainerConfig
from envrl.trainer.loss import policy_loss, token_logprobs

E = math.exp
# Four trained tokens: log-ratios +0.5, -0.5, +0.5, -0.5 with advantages 2, 1, -1, -0.5.
INFERENCE = torch.tensor([-1.0, -1.0, -2.0, -2.0])
ADVANTAGES = torch.tensor([2.0, 1.0, -1.0, -0.5])
WEIGHTS = torch.full((4,), 0.25)
ALL = torch.ones(4, dtype=torch.bool)


def run(config: LossConfig, log_ratio: list[float], mask: torch.Tensor = ALL):
    logprobs = (INFERENCE + torch.tensor(log_ratio)).requires_grad_()
    loss, stats = policy_loss(logprobs, INFERENCE, ADVANTAGES, mask, WEIGHTS, config)
    loss.backward()
    return loss.item(), logprobs.grad.tolist(), stats


def test_plain_importance_weighted_policy_gradient():
    loss, grad, stats = run(LossConfig(clip=False), [0.5, -0.5, 0.5, -0.5])
    per_token = [-E(0.5) * 2, -E(-0.5) * 1, E(0.5) * 1, E(-0.5) * 0.5]
    assert math.isclose(loss, 0.25 * sum(per_token), rel_tol=1e-6)
    # d(-r A w)/d logp = -r A w: the importance-weighted policy gradient.
    assert all(math.isclose(g, 0.25 * t, rel_tol=1e-6) for g, t in zip(grad, per_token, strict=True))
    assert stats["clipped"].item() == 0


def test_ppo_clip_takes_the_pessimistic_term_and_stops_gradient_outside_the_trust_region():
    loss, grad, stats = run(LossConfig(clip=(0.2, 0.2)), [0.5, -0.5, 0.5, -0.5])
    # token 0: A>0, r=1.65 > 1.2 -> clipped to 1.2; token 3: A<0, r=0.61 < 0.8 -> clipped to 0.8.
    expected = 0.25 * (-1.2 * 2 + -E(-0.5) * 1 + E(0.5) * 1 + 0.8 * 0.5)
    assert math.isclose(loss, expected, rel_tol=1e-6)
    assert grad[0] == 0.0 and grad[3] == 0.0
    assert math.isclose(grad[1], -0.25 * E(-0.5), rel_tol=1e-6)
    assert math.isclose(grad[2], 0.25 * E(0.5), rel_tol=1e-6)
    assert stats["clipped"].item() == 2


def test_asymmetric_clip_bounds():
    loss, _, stats = run(LossConfig(clip=(0.5, 0.7)), [0.5, -0.5, 0.5, -0.5])
    # [0.5, 1.7] contains both ratios: nothing is clipped.
    assert math.isclose(loss, 0.25 * (-E(0.5) * 2 - E(-0.5) + E(0.5) + E(-0.5) * 0.5), rel_tol=1e-6)
    assert stats["clipped"].item() == 0


def test_ratio_mask_drops_tokens_outside_the_bounds_without_renormalising():
    config = LossConfig(clip=False, ratio_mask=(0.5, 2.0))
    loss, grad, stats = run(config, [1.0, -1.0, 0.5, 0.0])
    # r = 2.72 and 0.37 are outside [0.5, 2]: those tokens get no loss and no gradient.
    assert math.isclose(loss, 0.25 * (E(0.5) * 1 + 1.0 * 0.5), rel_tol=1e-6)
    assert grad[0] == 0.0 and grad[1] == 0.0 and grad[2] != 0.0
    assert stats["masked"].item() == 2


def test_kl_penalty_adds_k3_towards_the_inference_policy():
    config = LossConfig(clip=False, kl_coef=0.1)
    loss, grad, _ = run(config, [0.5, -0.5, 0.5, -0.5])
    k3 = [E(-lr) - 1 + lr for lr in (0.5, -0.5, 0.5, -0.5)]
    pg = [-E(0.5) * 2, -E(-0.5) * 1, E(0.5) * 1, E(-0.5) * 0.5]
    assert math.isclose(loss, 0.25 * sum(p + 0.1 * k for p, k in zip(pg, k3, strict=True)), rel_tol=1e-6)
    # d k3 / d lr = 1 - exp(-lr): pushes logp down where it is above the inference logp.
    assert math.isclose(grad[0], 0.25 * (pg[0] + 0.1 * (1 - E(-0.5))), rel_tol=1e-6)


def test_reference_kl_adds_k3_towards_the_reference_and_reports_its_sum():
    """The policy sits 0.5 above / below the inference logprobs; the reference sits at them + 0.2."""
    logprobs = (INFERENCE + torch.tensor([0.5, -0.5, 0.5, -0.5])).requires_grad_()
    reference = INFERENCE + 0.2
    config = LossConfig(clip=False, ref_kl_coef=0.3)
    loss, stats = policy_loss(logprobs, INFERENCE, ADVANTAGES, ALL, WEIGHTS, config, reference)
    loss.backward()
    d = [0.3, -0.7, 0.3, -0.7]  # logp - logp_ref
    k3 = [E(-x) - 1 + x for x in d]
    pg = [-E(0.5) * 2, -E(-0.5) * 1, E(0.5) * 1, E(-0.5) * 0.5]
    assert math.isclose(loss.item(), 0.25 * sum(p + 0.3 * k for p, k in zip(pg, k3, strict=True)), rel_tol=1e-6)
    assert math.isclose(stats["ref_kl"].item(), sum(k3), rel_tol=1e-6)
    # d k3 / d logp = 1 - exp(logp_ref - logp): towards the reference.
    assert math.isclose(logprobs.grad[1].item(), 0.25 * (pg[1] + 0.3 * (1 - E(0.7))), rel_tol=1e-6)


def test_masked_tokens_contribute_nothing_even_with_extreme_ratios():
    mask = torch.tensor([True, False, False, True])
    loss, grad, stats = run(LossConfig(clip=False, kl_coef=0.5), [0.0, 200.0, -200.0, 0.0], mask)
    assert math.isclose(loss, 0.25 * (-2.0 + 0.5), rel_tol=1e-6)
    assert all(math.isfinite(g) for g in grad) and grad[1] == 0.0 and grad[2] == 0.0
    assert stats["loss_tokens"].item() == 2


def test_mismatch_kl_statistic_is_the_k3_sum_over_trained_tokens():
    _, _, stats = run(LossConfig(), [0.5, -0.5, 0.0, 0.0])
    assert math.isclose(stats["mismatch_kl"].item(), (E(-0.5) - 0.5) + (E(0.5) - 1.5), rel_tol=1e-6)


def test_token_logprobs_score_each_token_with_the_previous_position():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]])
    logprobs, entropy = token_logprobs(logits, torch.tensor([1, 0, 1]), torch.ones(3))
    assert logprobs[0].item() == 0.0 and entropy[0].item() == 0.0
    assert math.isclose(logprobs[1].item(), math.log(0.5), rel_tol=1e-6)
    assert math.isclose(logprobs[2].item(), math.log(0.25), rel_tol=1e-6)
    assert math.isclose(entropy[1].item(), math.log(2.0), rel_tol=1e-6)
    assert math.isclose(entropy[2].item(), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), rel_tol=1e-6)


def test_each_token_is_scored_at_its_own_sampling_temperature():
    logits = torch.tensor([[math.log(9.0), 0.0], [math.log(9.0), 0.0], [0.0, 0.0]])
    logprobs, _ = token_logprobs(logits, torch.tensor([0, 0, 0]), torch.tensor([1.0, 2.0, 0.5]))
    # token 1 at T = 2: logits / 2 = [log 3, 0] -> 3/4; token 2 at T = 0.5: [2 log 9, 0] -> 81/82
    assert math.isclose(logprobs[1].item(), math.log(0.75), rel_tol=1e-6)
    assert math.isclose(logprobs[2].item(), math.log(81 / 82), rel_tol=1e-6)


def test_top_k_and_top_p_renormalise_over_the_tokens_vllm_keeps():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.stack([probs.log()] * 4)
    ids = torch.tensor([0, 1, 1, 1])
    ones = torch.ones(4)
    # row 1: top_k = 2 keeps {0.5, 0.3}; row 2: top_p = 0.75 keeps 0.5 + 0.3 (cumulative from the
    # least likely: 0.05, 0.2 <= 0.25 dropped, 0.35 kept); row 3: no truncation
    logprobs, _ = token_logprobs(logits, ids, ones, torch.tensor([1.0, 1.0, 0.75, 1.0]), torch.tensor([0, 2, 0, 0]))
    assert logprobs[1:].tolist() == pytest.approx([math.log(0.3 / 0.8), math.log(0.3 / 0.8), math.log(0.3)], rel=1e-5)


def test_truncated_logprobs_have_finite_gradients_through_the_normaliser():
    logits = torch.tensor([[2.0, 1.0, -1.0], [0.0, 0.0, 0.0]], requires_grad=True)
    logprobs, _ = token_logprobs(
        logits, torch.tensor([0, 1]), torch.ones(2), torch.tensor([1.0, 1.0]), torch.tensor([0, 2])
    )
    logprobs.sum().backward()
    p = torch.softmax(torch.tensor([2.0, 1.0]), dim=0)
    # d/dz log(p_1 / (p_0 + p_1)) = onehot(1) - renormalised p over the kept {0, 1}, 0 for the dropped token
    assert logits.grad[0].tolist() == pytest.approx([-p[0].item(), 1 - p[1].item(), 0.0], abs=1e-6)


def test_unknown_inference_logprob_counts_as_on_policy():
    """Back-filled tokens carry NaN: ratio 1, plain policy gradient, no mismatch, no NaN."""
    inference = torch.tensor([-1.0, math.nan, -2.0, math.nan])
    logprobs = torch.tensor([-1.5, -0.7, -1.5, -3.0], requires_grad=True)
    loss, stats = policy_loss(logprobs, inference, ADVANTAGES, ALL, WEIGHTS, LossConfig(clip=False))
    loss.backward()
    assert math.isclose(loss.item(), 0.25 * (-E(-0.5) * 2 - 1.0 * 1 + E(0.5) * 1 + 1.0 * 0.5), abs_tol=1e-6)
    assert [
        math.isclose(g, 0.25 * -a, rel_tol=1e-6)
        for g, a in zip(logprobs.grad.tolist()[1::2], ADVANTAGES.tolist()[1::2], strict=True)
    ] == [True, True]
    expected_kl = sum(E(-d) - 1 + d for d in (-0.5, 0.5))
    assert math.isclose(stats["mismatch_kl"].item(), expected_kl, rel_tol=1e-5)


def test_sequence_level_ratio_gives_each_sample_the_mean_of_its_token_log_ratios():
    """GSPO: two samples of two tokens; each sample's log-ratios average to 0 (ratio 1), and the
    gradient of exp(mean) spreads the sample's summed advantage evenly over its tokens."""
    logprobs = (INFERENCE + torch.tensor([0.5, -0.5, 0.5, -0.5])).requires_grad_()
    config = LossConfig(clip=False, ratio_level="sequence")
    loss, _ = policy_loss(logprobs, INFERENCE, ADVANTAGES, ALL, WEIGHTS, config, lengths=(2, 2))
    loss.backward()
    assert math.isclose(loss.item(), -0.25 * ADVANTAGES.sum().item(), rel_tol=1e-6)
    assert logprobs.grad.tolist() == pytest.approx([-0.25 * 3 / 2] * 2 + [0.25 * 1.5 / 2] * 2)


def test_sequence_level_clipping_stops_the_whole_sample():
    logprobs = (INFERENCE + torch.tensor([0.5, 0.4, 0.0, 0.1])).requires_grad_()
    config = LossConfig(clip=(0.2, 0.2), ratio_level="sequence")
    loss, stats = policy_loss(logprobs, INFERENCE, ADVANTAGES, ALL, WEIGHTS, config, lengths=(2, 2))
    loss.backward()
    # sample 0: mean 0.45, r = 1.57 > 1.2 with A > 0: clipped; sample 1: r = 1.05, inside
    assert logprobs.grad[:2].tolist() == [0.0, 0.0] and all(g != 0 for g in logprobs.grad[2:].tolist())
    assert stats["clipped"].item() == 2


@pytest.mark.parametrize(
    ("key", "value", "replacement"),
    [
        ("ppo_clip", "false", r"clip = \[low, high\] turns clipping on .*clip = false off"),
        ("clip_high", "0.28", r"clip = \[low, high\]: the ratio is clipped to \[1 - low, 1 \+ high\]"),
        ("mask_low", "0.5", r"ratio_mask = \[low, high\]"),
    ],
)
def test_the_old_clip_and_mask_keys_name_the_range_that_replaced_them(key: str, value: str, replacement: str) -> None:
    with pytest.raises(ConfigError, match=rf"'loss.{key}'.*it was removed: {replacement}"):
        resolve_config(TrainerConfig, overrides=[(f"loss.{key}", value)])


def test_clipping_turned_off_stays_off_through_the_toml_a_process_gets() -> None:
    config = resolve_config(TrainerConfig, overrides=[("loss.clip", "false"), ("loss.ratio-mask", "[0.5, 2.0]")])
    assert (config.loss.clip, config.loss.ratio_mask) == (False, (0.5, 2.0))
    again = TrainerConfig.model_validate(tomllib.loads(config_to_toml(config)))
    assert (again.loss.clip, again.loss.ratio_mask) == (False, (0.5, 2.0))
    assert LossConfig().clip == (0.2, 0.2) and LossConfig().ratio_mask is None
    with pytest.raises(ConfigError, match=r"ratio_mask.*give the \(low, high\) pair, e.g. \[0.5, 2.0\]"):
        resolve_config(TrainerConfig, overrides=[("loss.ratio-mask", "true")])
