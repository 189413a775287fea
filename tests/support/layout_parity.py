"""Trainer layouts on the same batches: 2 ranks against one process match within the tolerances
justified below; the same 2 ranks placed on one host or on two hosts train bit for bit alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.run_files import metric_lines
from tests.support.tiny_chat import TINY_CHAT_DIR

WEIGHT_ATOL = 1e-5
"""Max abs difference of published weights (|w| <= ~1; measured rounding differences are ~1e-7)."""
METRIC_RTOL = 1e-4
"""Per-step trainer metrics of the two layouts (fp32 sums in another order; measured 3e-6 on the
grad norm; see test_trainer_distributed.py). Not the loss: on-policy with group-centred advantages
it is 0 up to rounding (~1e-9), so its relative difference says nothing."""
COMPARED_METRICS = ("trainer/grad_norm", "trainer/entropy")


def trained_metrics(out: Path, steps: int) -> list[dict]:
    """The first `steps` trainer steps' metrics of the run in `out`, in step order."""
    trained = [m for m in metric_lines(out) if "trainer/grad_norm" in m][:steps]
    assert [m["step"] for m in trained] == list(range(steps)), trained
    return trained


def trained_weights(a: Path, b: Path, steps: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The step-`steps` weights `a` and `b` published, the same tensors, every one moved from the tiny model's."""
    start = load_file(TINY_CHAT_DIR / "model.safetensors")
    weights_a, weights_b = (load_file(out / "weights" / f"step_{steps}" / "model.safetensors") for out in (a, b))
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert not torch.equal(weights_a[name], start[name]), f"{name} was not trained"
    return weights_a, weights_b


def assert_trained_as_one_process(layout: Path, one: Path, steps: int) -> None:
    """`layout`'s first `steps` trainer steps and its step-`steps` weights match `one`'s, and every
    weight moved from the tiny model's."""
    by_one, by_layout = trained_metrics(one, steps), trained_metrics(layout, steps)
    for want, got in zip(by_one, by_layout, strict=True):
        for key in COMPARED_METRICS:
            assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL), (want["step"], key)
    single, other = trained_weights(one, layout, steps)
    for name in single:
        diff = (single[name] - other[name]).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{name}: max abs diff {diff:.2e}"


def assert_trained_bit_for_bit_alike(a: Path, b: Path, steps: int) -> None:
    """`a` and `b` (the same ranks and shards, each rank on one torch thread) have identical first
    `steps` trainer steps, loss included, and identical step-`steps` weights: where the ranks run
    changes which sockets gloo uses, not one floating-point operation or its order, so the
    tolerance is zero."""
    keys = ("step", "trainer/loss", *COMPARED_METRICS)
    assert [[m[k] for k in keys] for m in trained_metrics(a, steps)] == [
        [m[k] for k in keys] for m in trained_metrics(b, steps)
    ]
    weights_a, weights_b = trained_weights(a, b, steps)
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), f"{name} differs"
