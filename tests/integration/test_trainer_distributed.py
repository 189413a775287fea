"""Two torchrun ranks (gloo, CPU) through the FSDP2 path compute the same training steps as one process.

The two layouts sum gradients in different orders, so they agree only up to fp32 rounding, and
the comparison must not amplify that rounding. Adam's first steps do: its update is about
lr * g / |g|, so a gradient entry near zero whose sign differs by rounding moves its weight by up
to 2 * lr (seen: 4.6e-5 at lr 3e-3 on another machine; a simulated 1e-6 relative gradient noise
gives 2e-4). With `eps` far above every |g| (gradients are clipped to norm 1, so |g| <= 1 = eps)
the update lr * m / (sqrt(v) + eps) changes by at most lr / eps times a change of the gradient,
so the weights differ by no more than the gradients do: the optimizer state is still sharded and
stepped, only the amplifier is off.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from envrl.config import resolve_config
from envrl.samples import write_batch
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from scripts.bench.synthetic import synthetic_samples
from scripts.tiny_model import DEFAULT_DIR
from tests.integration.commands import run_to_completion

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT_S = 240
ARGS = {
    "max-steps": "2",
    "max-tokens": "64",
    "model.name": str(DEFAULT_DIR),
    "optim.lr": "1.0",
    "optim.eps": "1.0",  # lr / eps = 1: weights differ by at most what the gradients differ by
    "optim.max-grad-norm": "1.0",
    "wandb.mode": "disabled",
}
# fp32 reductions over the ~2e5 gradient entries of the tiny model round with a relative error of
# order sqrt(n) * 6e-8 ~ 3e-5 in the worst random walk (measured: 1.6e-6 on the grad norm); the
# loss and entropy are fp64 sums of per-token fp32 values that differ only after the first update.
METRIC_RTOL = 1e-4
# |weight| <= ~1 (norm weights are 1.0, one fp32 ulp there is 1.2e-7); gradient rounding of 1e-5
# relative, 10x the worst measured, moves weights by 2e-7 in this setting (simulated).
WEIGHT_ATOL, WEIGHT_RTOL = 1e-6, 1e-5
COMPARED_METRICS = ("trainer/loss", "trainer/grad_norm", "trainer/entropy", "trainer/mismatch_kl")


def metric_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_sharded_ranks_match_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        for step in range(2):  # 7 samples in 64-token rows: an odd number of micro-batches to split
            write_batch(out, step, synthetic_samples(7, policy_step=step, seed=3))

    config = resolve_config(TrainerConfig, overrides=[*ARGS.items(), ("output-dir", str(one))])
    Trainer(config, init_runtime(config)).run()

    cli = [f"--{key}={value}" for key, value in {**ARGS, "output-dir": str(two), "ckpt.interval": "2"}.items()]
    proc = run_to_completion(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "envrl.trainer", *cli], TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout

    single_metrics, sharded_metrics = metric_lines(one), metric_lines(two)
    assert [m["step"] for m in sharded_metrics] == [m["step"] for m in single_metrics] == [0, 1]
    for want, got in zip(single_metrics, sharded_metrics, strict=True):
        for key in COMPARED_METRICS:
            assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL), (want["step"], key)

    start = load_file(DEFAULT_DIR / "model.safetensors")
    single = load_file(one / "weights" / "step_2" / "model.safetensors")
    sharded = load_file(two / "weights" / "step_2" / "model.safetensors")
    assert single.keys() == sharded.keys()
    for name in single:
        assert not torch.equal(single[name], start[name]), f"{name} was not trained"
        assert torch.allclose(single[name], sharded[name], atol=WEIGHT_ATOL, rtol=WEIGHT_RTOL), name
    assert sorted(p.name for p in (two / "checkpoints" / "step_2").iterdir() if p.name.startswith("rng")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]
