"""Two torchrun ranks (gloo, CPU) through the FSDP2 path: same steps as one process, rank 0's
weights load as a plain HF model, and a 2-rank checkpoint resumes bit for bit on 2 ranks.

The two layouts sum gradients in different orders, so they agree only up to fp32 rounding, and
the comparison must not amplify that rounding. Adam's first steps do: its update is about
lr * g / |g|, so a gradient entry near zero whose sign differs by rounding moves its weight by up
to 2 * lr (seen: 4.6e-5 at lr 3e-3 on another machine; a simulated 1e-6 relative gradient noise
gives 2e-4). With `eps` far above every |g| (gradients are clipped to norm 1, so |g| <= 1 = eps)
the update lr * m / (sqrt(v) + eps) changes by at most lr / eps times a change of the gradient,
so the weights differ by no more than the gradients do: the optimizer state is still sharded and
stepped, only the amplifier is off. A resume runs the same ranks on the same data in the same
order, so it must agree exactly, with nothing to tolerate.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from envrl.config import resolve_config
from envrl.trainer.checkpoint import RankCountMismatch
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from tests.support.commands import run_to_completion
from tests.support.run_files import metric_lines, write_batches
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT_S = 240
STEPS = 3
ARGS = {
    "max-steps": str(STEPS),
    "micro-batch-tokens": "64",
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
# relative, 10x the worst measured, moves weights by 2e-7 per step in this setting (simulated),
# so 3 steps stay inside 1e-6 absolute, below the 1e-5 the issue asks for.
WEIGHT_ATOL, WEIGHT_RTOL = 1e-6, 1e-5
COMPARED_METRICS = ("trainer/loss", "trainer/grad_norm", "trainer/entropy", "trainer/mismatch_kl")


def torchrun_trainer(out: Path, **extra: str) -> None:
    cli = [f"--{key}={value}" for key, value in {**ARGS, "output-dir": str(out), **extra}.items()]
    proc = run_to_completion(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "envrl.trainer", *cli], TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank run of STEPS steps with a checkpoint after every step (the newest two kept)."""
    out = tmp_path_factory.mktemp("two_ranks")
    write_batches(
        out, STEPS, count=7, seed=3
    )  # 7 samples in 64-token rows: more rows than ranks, padded to an even count
    torchrun_trainer(out, **{"ckpt.interval": "1"})
    return out


def test_two_sharded_ranks_match_one_process(two_ranks, tmp_path):
    one = tmp_path / "one"
    write_batches(one, STEPS, count=7, seed=3)
    config = resolve_config(TrainerConfig, overrides=[*ARGS.items(), ("output-dir", str(one))])
    Trainer(config, init_runtime(config)).run()

    single_metrics, sharded_metrics = metric_lines(one), metric_lines(two_ranks)
    assert [m["step"] for m in sharded_metrics] == [m["step"] for m in single_metrics] == list(range(STEPS))
    for want, got in zip(single_metrics, sharded_metrics, strict=True):
        assert got["trainer/micro_batches"] % 2 == 0, got  # balanced_bins: a multiple of the ranks
        for key in COMPARED_METRICS:
            assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL), (want["step"], key)

    start = load_file(DEFAULT_DIR / "model.safetensors")
    single = load_file(one / "weights" / f"step_{STEPS}" / "model.safetensors")
    sharded = load_file(two_ranks / "weights" / f"step_{STEPS}" / "model.safetensors")
    assert single.keys() == sharded.keys()
    for name in single:
        assert not torch.equal(single[name], start[name]), f"{name} was not trained"
        assert torch.allclose(single[name], sharded[name], atol=WEIGHT_ATOL, rtol=WEIGHT_RTOL), name


def test_rank_zero_publishes_full_hf_weights_of_every_step(two_ranks):
    with safe_open(DEFAULT_DIR / "model.safetensors", "pt") as f:
        base_names = sorted(f.keys())
    for step in range(1, STEPS + 1):
        published = two_ranks / "weights" / f"step_{step}"
        with safe_open(published / "model.safetensors", "pt") as f:
            assert sorted(f.keys()) == base_names, step  # gathered whole, tied lm_head left out
        assert (published / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(two_ranks / "weights" / f"step_{STEPS}")
    reloaded = model.state_dict()
    published = load_file(two_ranks / "weights" / f"step_{STEPS}" / "model.safetensors")
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in published.items())
    assert not list((two_ranks / "weights").glob(".*"))  # no temp dirs left by any rank
    checkpoint = two_ranks / "checkpoints" / f"step_{STEPS}"
    assert sorted(p.name for p in checkpoint.iterdir() if p.name.startswith("rng")) == [
        "rng_rank0.pt",
        "rng_rank1.pt",
    ]


def test_two_rank_checkpoint_resumes_bit_for_bit_on_two_ranks(two_ranks, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(two_ranks / "rollouts", resumed / "rollouts")
    shutil.copytree(two_ranks / "checkpoints" / f"step_{STEPS - 1}", resumed / "checkpoints" / f"step_{STEPS - 1}")
    torchrun_trainer(resumed, resume="true")

    assert [m["step"] for m in metric_lines(resumed)] == [STEPS - 1]
    want, got = metric_lines(two_ranks)[-1], metric_lines(resumed)[-1]
    assert {k: got[k] for k in COMPARED_METRICS} == {k: want[k] for k in COMPARED_METRICS}
    straight = load_file(two_ranks / "weights" / f"step_{STEPS}" / "model.safetensors")
    again = load_file(resumed / "weights" / f"step_{STEPS}" / "model.safetensors")
    assert straight.keys() == again.keys()
    assert all(torch.equal(straight[name], again[name]) for name in straight)


def test_a_checkpoint_of_two_ranks_is_refused_by_one_naming_both_counts(two_ranks, tmp_path):
    config = resolve_config(
        TrainerConfig, overrides=[*ARGS.items(), ("output-dir", str(two_ranks)), ("resume", "true")]
    )
    trainer = Trainer(config, init_runtime(config))
    with pytest.raises(RankCountMismatch, match="written by 2 ranks but this run has 1"):
        trainer.start_step()
