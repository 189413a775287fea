"""On-policy distillation: every trained token gets `reward_coef * A + kl_coef * (log p_teacher - log p_student)`
before the step is published; a teacher failing past its retries fails the step with `TeacherError`
(docs/distill.md)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import ClassVar

from loguru import logger
from pydantic import Field, model_validator

from envrl.config import BaseConfig, ConfigError
from envrl.data.samples import TrainingSample
from envrl.orchestrator.teacher import TEACHER_API_KEY_ENV, TeacherClient
from envrl.runtime.http import RetryPolicy
from envrl.telemetry.metrics import MetricsSink


class DistillConfig(BaseConfig):
    """`orchestrator.distill`: the teacher and how its signal mixes with the env's reward
    (docs/distill.md: these keys next to TRL's and prime-rl's)."""

    teacher_url: str | None = None
    """The teacher's OpenAI-compatible server, e.g. "http://127.0.0.1:8100/v1" (envrl's `inference`
    on the teacher's weights, or `vllm serve`): it must return vLLM's `prompt_logprobs` and serve
    `/tokenize`, with the student's tokenizer. Set this or `teacher_weights`."""
    teacher_weights: str | None = None
    """A model directory (e.g. an envrl run's `weights/final`) that `rl` serves as the teacher on a
    second vLLM of its own, on `teacher_port`, supervised like the run's inference; `rl` then
    sets `teacher_url` itself. Set this or `teacher_url`."""
    teacher_port: int = Field(8100, ge=1, le=65535)
    """Port of the teacher server `rl` starts for `teacher_weights`."""
    teacher_api_key_env: str = TEACHER_API_KEY_ENV
    """Environment variable with the teacher's API key, sent as a bearer token when set (the
    teacher `rl` serves takes the run's own key)."""
    teacher_model: str | None = None
    """The model name to ask the teacher for; default: the one model it lists."""
    kl_coef: float = Field(1.0, ge=0)
    """Weight of the per-token reverse-KL advantage log p_teacher - log p_student."""
    reward_coef: float = Field(0.0, ge=0)
    """Weight of the env's group advantage; 0 (the default) distils alone, the reward then only
    shows in metrics and evals."""
    max_concurrency: ClassVar[int] = 16
    """Samples scored by the teacher at once."""
    ready_timeout_s: ClassVar[float] = 600.0
    """Seconds to wait at start-up for the teacher to answer (one inference start-up limit, as rl's)."""

    @model_validator(mode="after")
    def _one_teacher(self) -> DistillConfig:
        if (self.teacher_url is None) == (self.teacher_weights is None):
            raise ValueError(
                "orchestrator.distill needs exactly one teacher: teacher_url (a server you started) or "
                "teacher_weights (a model directory rl serves)"
            )
        return self


def distilled(
    sample: TrainingSample, teacher_logprobs: Sequence[float], config: DistillConfig
) -> tuple[TrainingSample, float, int]:
    """`sample` with its per-token advantages set from `teacher_logprobs` (one per token), the sum
    of its trained tokens' log p_student - log p_teacher (the reverse-KL estimate) and their count."""
    if len(teacher_logprobs) != len(sample.input_ids):
        raise ValueError(f"{len(teacher_logprobs)} teacher logprobs for a sample of {len(sample.input_ids)} tokens")
    advantages, kl_sum, scored = [], 0.0, 0
    for mask, student, teacher in zip(sample.loss_mask, sample.inference_logprobs, teacher_logprobs, strict=True):
        advantage = 0.0
        if mask:
            advantage = config.reward_coef * sample.advantage
            if not math.isnan(student):
                advantage += config.kl_coef * (teacher - student)
                kl_sum += student - teacher
                scored += 1
        advantages.append(advantage)
    return sample.model_copy(update={"token_advantages": advantages}), kl_sum, scored


class Distiller:
    """Sets each step's per-token advantages from the teacher; `start` before the first step."""

    def __init__(self, config: DistillConfig, sink: MetricsSink) -> None:
        self.config = config
        self.sink = sink
        if config.teacher_url is None:
            raise ConfigError(
                f"orchestrator.distill.teacher_weights = {config.teacher_weights!r} is served by `rl`, which then "
                "sets teacher_url; a standalone orchestrator needs teacher_url: serve the weights yourself "
                "(`inference --model.name WEIGHTS --port 8100`) and set orchestrator.distill.teacher_url"
            )
        self.teacher = TeacherClient(
            config.teacher_url, config.teacher_model, RetryPolicy(), config.teacher_api_key_env
        )

    async def start(self, student_url: str, student_model: str) -> None:
        await self.teacher.start(student_url, student_model, self.config.ready_timeout_s)

    async def apply(self, step: int, samples: list[TrainingSample]) -> list[TrainingSample]:
        """The step's samples with distillation advantages; logs `distill/` metrics for the step."""
        started = time.monotonic()
        gate = asyncio.Semaphore(self.config.max_concurrency)

        async def score(sample: TrainingSample) -> list[float]:
            async with gate:
                return await self.teacher.logprobs(sample.input_ids)

        scores = await asyncio.gather(*(score(s) for s in samples))
        results = [distilled(s, lp, self.config) for s, lp in zip(samples, scores, strict=True)]
        tokens = sum(n for _, _, n in results)
        reverse_kl = sum(kl for _, kl, _ in results) / tokens if tokens else math.nan
        seconds = time.monotonic() - started
        self.sink.log(
            step, {"distill/reverse_kl": reverse_kl, "distill/scored_tokens": tokens, "distill/teacher_s": seconds}
        )
        logger.info(
            f"step {step}: teacher scored {tokens} tokens of {len(samples)} samples in {seconds:.1f} s; "
            f"reverse KL to it {reverse_kl:.3f} nats/token"
        )
        return [s for s, _, _ in results]

    async def aclose(self) -> None:
        await self.teacher.aclose()
