"""The grouped CPU LoRA ops compute what vLLM's own torch ops define, slot -1 and mixed slots included.

Both sides are float32 products of the same numbers in another order: inputs of order 1 and
rank-16 dot products differ by a few ulps (~1e-6), far below 1e-4, while a wrong slot, a
missing scale or a dropped add changes outputs by order 1.
"""

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops

from envrl.inference import cpu_lora

SLOTS, RANK, WIDTH, TOKENS = 3, 16, 48, 9
INDICES = {
    "one adapter": [1] * TOKENS,
    "mixed with no adapter (-1)": [0, 1, -1, 1, 2, -1, 0, 0, 2],
}


def tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "x_in": torch.randn(TOKENS, WIDTH, generator=generator),
        "a": torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator),
        "x_rank": torch.randn(TOKENS, RANK, generator=generator),
        "b": torch.randn(SLOTS, 1, WIDTH, RANK, generator=generator),
        "out": torch.randn(TOKENS, 2 * WIDTH, generator=generator),
    }


@pytest.mark.parametrize("indices", INDICES.values(), ids=INDICES.keys())
def test_grouped_lora_ops_match_vllms_torch_ops(indices: list[int]) -> None:
    idx = torch.tensor(indices)
    t = tensors(0)
    calls = {
        "shrink": lambda ops, out: ops.bgmv_shrink(t["x_in"], t["a"], out, idx, 0.5),
        "expand": lambda ops, out: ops.bgmv_expand(t["x_rank"], t["b"], out, idx, True),
        "expand (assign)": lambda ops, out: ops.bgmv_expand(t["x_rank"], t["b"], out, idx, False),
        "expand slice": lambda ops, out: ops.bgmv_expand_slice(t["x_rank"], t["b"], out, idx, WIDTH, WIDTH, True),
    }
    for name, call in calls.items():
        ours, theirs = t["out"].clone(), t["out"].clone()
        call(cpu_lora, ours)
        call(lora_ops, theirs)
        assert (ours - theirs).abs().max() < 1e-4, name
        assert (ours - t["out"]).abs().max() > 1e-1, name  # the op did write something
