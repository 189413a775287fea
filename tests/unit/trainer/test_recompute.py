"""`activation_checkpointing = "auto"` recomputes only as many layers as memory needs."""

import pytest

from envrl.trainer.model.recompute import HEAD_BYTES, MARGIN, OPTIMIZER_BYTES_PER_PARAM, LayerShape, plan_recompute
from tests.support.trainers import make_trainer

GIB = 2**30
QWEN3_06B = LayerShape(hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, layers=28)
PARAMS = 596_000_000
OVERHEAD = OPTIMIZER_BYTES_PER_PARAM * PARAMS + HEAD_BYTES  # what the budget sets aside besides the margin


def free_for(activations: float) -> int:
    """Free bytes that leave exactly `activations` bytes of budget."""
    return int((activations + OVERHEAD) / (1 - MARGIN)) + 1


def plan(free: int, tokens: int = 16384):
    return plan_recompute("auto", QWEN3_06B, tokens, 2, free, PARAMS)


def test_the_estimate_at_qwen3_06b_is_56_kib_per_token_and_layer():
    assert QWEN3_06B.saved_per_token() * 2 == 56 * 1024


def test_nothing_is_recomputed_when_every_layer_fits():
    per_layer = QWEN3_06B.saved_per_token() * 16384 * 2
    assert plan(free_for(28 * per_layer)).every == 0
    assert "no layer recomputed" in plan(free_for(28 * per_layer)).reason
    assert plan(140 * GIB).every == 0  # an idle H200


def test_just_short_of_fitting_recomputes_few_layers_and_far_short_all():
    per_layer = QWEN3_06B.saved_per_token() * 16384 * 2
    short = plan(free_for(27 * per_layer))
    assert short.every >= 2 and len(short.checkpointed(28)) <= 4
    assert plan(free_for(3 * per_layer)).every == 1
    assert plan(12 * GIB).every == 1
    assert plan(30 * GIB).every == 3  # 10 of 28 layers: 18 x 0.88 + 10 x 0.05 + 0.88 GiB <= 19.3 GiB


def test_more_memory_never_recomputes_more_layers():
    counts = [len(plan(gib * GIB).checkpointed(28)) for gib in range(10, 120, 2)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 28 and counts[-1] == 0


def test_shorter_rows_need_less_recompute():
    free = 40 * GIB
    assert len(plan(free, 4096).checkpointed(28)) <= len(plan(free, 16384).checkpointed(28))
    assert plan(free, 2048).every == 0


def test_true_and_false_are_taken_as_said():
    assert plan_recompute(True, QWEN3_06B, 16, 2, 10**15, 1).every == 1
    assert plan_recompute(False, QWEN3_06B, 10**6, 2, 1, 1).every == 0
    with pytest.raises(ValueError, match="activation_checkpointing"):
        plan_recompute("some", QWEN3_06B, 16, 2, 1, 1)


def test_every_kth_layer_is_checkpointed_in_the_model(tmp_path):
    trainer = make_trainer(tmp_path, activation_checkpointing=True)
    layers = trainer.learner.model.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    default = make_trainer(tmp_path / "auto")  # the tiny model at 128 tokens fits anywhere
    assert not any(layer.gradient_checkpointing for layer in default.learner.model.model.layers)
