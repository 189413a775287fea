"""Two trainer layouts (ranks on one host, ranks on two hosts) against one process on the same
batches: the same per-step metrics and published weights, within tolerances justified below."""

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


def assert_trained_as_one_process(layout: Path, one: Path, steps: int) -> None:
    """`layout`'s first `steps` trainer steps and its step-`steps` weights match `one`'s, and every
    weight moved from the tiny model's."""
    by_layout = [m for m in metric_lines(layout) if "trainer/grad_norm" in m][:steps]
    by_one = [m for m in metric_lines(one) if "trainer/grad_norm" in m]
    assert [m["step"] for m in by_one] == [m["step"] for m in by_layout] == list(range(steps))
    for want, got in zip(by_one, by_layout, strict=True):
        for key in COMPARED_METRICS:
            assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL), (want["step"], key)
    start = load_file(TINY_CHAT_DIR / "model.safetensors")
    single = load_file(one / "weights" / f"step_{steps}" / "model.safetensors")
    other = load_file(layout / "weights" / f"step_{steps}" / "model.safetensors")
    assert single.keys() == other.keys()
    for name in single:
        assert not torch.equal(single[name], start[name]), f"{name} was not trained"
        diff = (single[name] - other[name]).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{name}: max abs diff {diff:.2e}"
