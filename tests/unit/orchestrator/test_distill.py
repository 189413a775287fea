"""On-policy distillation's advantage: per token, reward_coef * A + kl_coef * (teacher - student)."""

import math
from pathlib import Path

import pytest

from envrl.config import ConfigError
from envrl.data.samples import TrainingSample
from envrl.orchestrator.distill import DistillConfig, Distiller, distilled
from envrl.telemetry.metrics import MetricsSink, WandbConfig

# Every logprob and coefficient below is a small multiple of a power of two, so each advantage
# is computed exactly in float64 and the comparisons can be exact.
SAMPLE = TrainingSample(
    input_ids=[5, 6, 7, 8, 9, 10],
    loss_mask=[0, 0, 1, 1, 0, 1],  # a prompt, two generated tokens, a tool token, one more generated
    inference_logprobs=[0.0, 0.0, -1.5, -0.25, 0.0, -2.0],
    advantage=0.5,
    env="e",
    task_idx=0,
    policy_step=0,
)
TEACHER = [0.0, -3.0, -0.5, -0.25, -4.0, -3.0]


def config(**keys: float) -> DistillConfig:
    return DistillConfig(teacher_url="http://127.0.0.1:1/v1", **keys)


def test_alone_each_trained_token_gets_the_teachers_minus_the_students_logprob():
    out, kl_sum, tokens = distilled(SAMPLE, TEACHER, config())
    assert out.token_advantages == [0.0, 0.0, 1.0, 0.0, 0.0, -1.0]
    assert (kl_sum, tokens) == (0.0, 3)  # (-1.5 + 0.5) + 0 + (-2 + 3): the reverse-KL estimate sums to 0 here
    assert out.advantage == SAMPLE.advantage and out.inference_logprobs == SAMPLE.inference_logprobs


def test_mixed_with_the_reward_the_group_advantage_is_added_per_token():
    out, _, _ = distilled(SAMPLE, TEACHER, config(kl_coef=0.5, reward_coef=2.0))
    assert out.token_advantages == [0.0, 0.0, 1.0 + 0.5, 1.0 + 0.0, 0.0, 1.0 - 0.5]


def test_a_token_without_a_sampling_logprob_gets_no_kl_term():
    logprobs = [0.0, 0.0, math.nan, -0.25, 0.0, -2.0]  # a back-filled turn's token
    backfilled = SAMPLE.model_copy(update={"inference_logprobs": logprobs})
    out, _, tokens = distilled(backfilled, TEACHER, config(reward_coef=1.0))
    assert out.token_advantages == [0.0, 0.0, 0.5, 0.5, 0.0, 0.5 - 1.0]
    assert tokens == 2


def test_teacher_logprobs_must_cover_every_token():
    with pytest.raises(ValueError, match="5 teacher logprobs for a sample of 6 tokens"):
        distilled(SAMPLE, TEACHER[:5], config())


def test_exactly_one_teacher_is_named() -> None:
    with pytest.raises(ValueError, match="exactly one teacher: teacher_url .* or teacher_weights"):
        DistillConfig()
    with pytest.raises(ValueError, match="exactly one teacher"):
        DistillConfig(teacher_url="http://127.0.0.1:1/v1", teacher_weights="w")


def test_a_standalone_orchestrator_cannot_serve_a_teacher_by_its_weights(tmp_path: Path) -> None:
    """Only `rl` starts a teacher server; the orchestrator alone needs the server's address."""
    sink = MetricsSink(tmp_path / "metrics.jsonl", WandbConfig(), process="orchestrator", output_dir=tmp_path)
    with pytest.raises(
        ConfigError, match="teacher_weights = 'w' is served by `rl`.*set orchestrator.distill.teacher_url"
    ):
        Distiller(DistillConfig(teacher_weights="w"), sink)
    sink.close()
