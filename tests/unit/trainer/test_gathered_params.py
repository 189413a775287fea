"""One sharded rank holds its bf16 parameters across micro-batches without changing the update."""

import json

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from envrl.config import resolve_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import Learner
from envrl.trainer.parallel import Runtime
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Runtime(rank=0, world_size=1, device=torch.device("cpu"), sharded=True, compute_dtype=torch.bfloat16)
    finally:
        dist.destroy_process_group()


class CastCounter(TorchDispatchMode):
    """Elements of flat (1-D) fp32 tensors cast to bf16: FSDP2's casts of its flat parameter
    shards (activations and gradients are 2-D and up)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        flat_fp32 = func is torch.ops.aten._to_copy.default and x.dtype == torch.float32 and x.dim() == 1
        if flat_fp32 and kwargs.get("dtype") == torch.bfloat16:
            self.elements += x.numel()
        return func(*args, **kwargs)


def trainer(tmp_path, runtime) -> Learner:
    overrides = {"micro_batch_tokens": 64, "optim": {"lr": 1e-3}, "compile": False}
    base = {"model": {"name": str(DEFAULT_DIR)}, "output_dir": str(tmp_path), "wandb": {"mode": "disabled"}}
    config = resolve_config(TrainerConfig, base=base, overrides=[(k, json.dumps(v)) for k, v in overrides.items()])
    return Learner(config, runtime)


def test_holding_gathered_params_gives_the_per_micro_batch_update(tmp_path, one_rank_group):
    samples = synthetic_samples(12, prompt_len=(4, 8), completion_len=(8, 24))
    held = trainer(tmp_path / "held", one_rank_group)
    with CastCounter() as held_casts:
        stats = held.train_on(0, samples, where="test")
    assert stats["micro_batches"] >= 3
    # the update as FSDP makes it without holding: gather and reduce around every micro-batch
    plain = trainer(tmp_path / "plain", one_rank_group)
    from envrl.trainer.packing import pack

    plain.optimizer.zero_grad(set_to_none=True)
    plain.model.set_reshard_after_forward(True)
    with CastCounter() as plain_casts:
        for mb in pack(samples, 64, "token"):
            plain.model.set_reshard_after_backward(True)
            plain.model.set_requires_gradient_sync(True)
            plain._forward_backward(0, mb)
    # the parameters are cast once for the step, not in forward and backward of each micro-batch
    parameters = sum(p.numel() for p in held.model.parameters())
    assert held_casts.elements == parameters
    assert plain_casts.elements >= stats["micro_batches"] * parameters
    torch.nn.utils.clip_grad_norm_(plain.model.parameters(), plain.config.optim.max_grad_norm)
    plain.optimizer.step()
    # Both sum the same bf16 micro-batch gradients in fp32 in the same order (one rank: the
    # reduction is a copy), so the AdamW update is the same up to fp32 reassociation: 1e-6
    # relative of a weight, far below one lr-sized step (1e-3) that a lost micro-batch would be.
    for (name, a), (_, b) in zip(held.model.named_parameters(), plain.model.named_parameters(), strict=True):
        torch.testing.assert_close(a.full_tensor(), b.full_tensor(), atol=1e-6, rtol=1e-6, msg=name)
