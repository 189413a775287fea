"""`rl` on the CPU smoke config with every policy sent to the replica in memory (envrl's gloo
engine through vLLM's weight-transfer API) learns as the same run does through files (the
session's `smoke_run`), and the replica serves exactly the policy the trainer computes with: run
on-policy (`max_async_level = 0`), every batch is sampled by the policy the trainer then
computes with, so the mismatch KL of every step, not only step 0's, is ~0 when the policy
arrived intact (with files and the smoke config's async level 1 it is 0.02-0.1 from step 1 on:
the sampling policy is one step older)."""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

from tests.support.run_files import metric_lines
from tests.support.smoke import FinishedRun, run_to_end


def per_step(out: Path, key: str) -> list[float]:
    return [m[key] for m in sorted(metric_lines(out), key=lambda m: m["step"]) if key in m]


def test_a_smoke_run_with_weights_in_memory_learns_like_one_with_files(smoke_run: FinishedRun, tmp_path: Path) -> None:
    out = tmp_path / "memory"
    overrides = ("--trainer.weights.transport", "memory", "--max-async-level", "0", "--restarts.max-restarts", "0")
    run_to_end(out, *overrides).check()
    sent = (out / "logs" / "inference.log").read_text().count("weights received in memory")
    assert sent >= 25, "most policies (all but every 10th and the last) go through memory"
    assert (out / "weights" / "step_39" / "transfer.json").is_file()
    assert (out / "weights" / "step_40" / "model.safetensors").is_file()  # the last policy is files

    rewards, file_rewards = per_step(out, "train/reward"), per_step(smoke_run.out, "train/reward")
    assert len(rewards) == len(file_rewards) == 40
    assert fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.3, rewards
    assert fmean(rewards[-5:]) >= fmean(file_rewards[-5:]) - 0.1, (rewards, file_rewards)
    # a policy received wrong would make the trainer's logprobs differ from the replica's
    assert set(per_step(out, "trainer/staleness_max")) == {0}
    mismatch = per_step(out, "trainer/mismatch_kl")
    assert max(abs(kl) for kl in mismatch) < 1e-3, mismatch
