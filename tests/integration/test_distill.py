"""On-policy distillation end to end: the teacher scores exactly the tokens the student sampled,
a teacher with another tokenizer is refused in one line, and `rl` runs the distillation recipe
(`configs/cpu/smollm2_distill.toml`) on a cut-down SmolLM2 student for a few steps, serving the
tiny model as the teacher itself (`teacher_weights`; both use the tiny byte-level tokenizer).

Tolerance of the scoring test: the teacher's prompt logprobs (one prefill) and the sampled
tokens' logprobs (one decode step each) come from the same float32 weights on the same server,
differing only in summation order (batched prefill GEMMs against one-row decode GEMMs): about
sqrt(K) * 6e-8 ~ 1e-6 relative per dot product of length K <= 256 through the tiny model's two
layers. 1e-4 leaves two orders of magnitude for that, while scoring the wrong tokens (an
off-by-one alignment) moves logprobs by more than 1e-1 on the random tiny model.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from envrl.model.inference import InferenceClient
from envrl.model.smollm2 import build_cut_down
from envrl.orchestrator.teacher import TeacherClient, TeacherError
from envrl.runtime.http import RetryPolicy
from tests.support.chaos_runs import ROOT
from tests.support.ports import free_port
from tests.support.run_files import metric_lines
from tests.support.secrets_probe import status
from tests.support.smoke import run_to_end
from tests.support.standin_inference import JsonHandler, serving
from tests.support.vllm_server import VLLMServer

RECIPE = ROOT / "configs" / "cpu" / "smollm2_distill.toml"
STEPS = 3
MAX_LOGPROB_DIFF = 1e-4
PROMPT = [1, 40, 41, 42, 43, 44, 45, 46]


def teacher(server: VLLMServer, url_suffix: str = "/v1") -> TeacherClient:
    return TeacherClient(server.base_url + url_suffix, None, RetryPolicy(max_retries=0, timeout_s=300.0))


def test_the_teacher_scores_exactly_the_tokens_the_student_sampled(vllm_server: VLLMServer) -> None:
    async def sample_and_score() -> tuple[list[float], list[float]]:
        student = InferenceClient(vllm_server.base_url, vllm_server.model, RetryPolicy(max_retries=0, timeout_s=300.0))
        scorer = teacher(vllm_server)
        try:
            await scorer.start(vllm_server.base_url, vllm_server.model, timeout=60.0)
            done = await student.generate(PROMPT, {"max_tokens": 12, "temperature": 1.0, "seed": 3, "ignore_eos": True})
            scores = await scorer.logprobs(PROMPT + done.completion_ids)
            return done.logprobs, scores
        finally:
            await student.aclose()
            await scorer.aclose()

    sampled, scored = asyncio.run(sample_and_score())
    assert len(scored) == len(PROMPT) + len(sampled) and scored[0] == 0.0
    assert max(abs(a - b) for a, b in zip(sampled, scored[len(PROMPT) :], strict=True)) < MAX_LOGPROB_DIFF
    # the same server as student and teacher: the reverse KL of what it sampled is ~0


class _OtherTokenizer(JsonHandler):
    """An OpenAI-compatible teacher whose tokenizer is not the student's: /tokenize gives other ids."""

    def do_GET(self) -> None:
        self._reply({"object": "list", "data": [{"id": "other-teacher", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._reply({"tokens": [7, 7, 7], "count": 3, "max_model_len": 2048})


@pytest.fixture
def other_tokenizer_teacher() -> Iterator[str]:
    with serving(_OtherTokenizer) as url:
        yield f"{url}/v1"


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(
    vllm_server: VLLMServer, other_tokenizer_teacher: str
) -> None:
    async def start() -> None:
        scorer = TeacherClient(other_tokenizer_teacher, None, RetryPolicy(max_retries=0))
        try:
            await scorer.start(vllm_server.base_url, vllm_server.model, timeout=30.0)
        finally:
            await scorer.aclose()

    with pytest.raises(TeacherError) as refused:
        asyncio.run(start())
    message = str(refused.value)
    assert "\n" not in message and message.startswith("refusing teacher 'other-teacher'"), message
    assert "tokenizer differs from the student's" in message


def probe_teacher(proc: subprocess.Popen[bytes], marker: str, port: int) -> dict[str, int]:
    """Once the teacher `rl` started answers /health: its models without the run's API key, and
    `/update_weights` without the run's token (HTTP statuses); {} if the run ended first."""
    while status(port, "/health", {}) != 200:
        if proc.poll() is not None:
            return {}
        time.sleep(0.2)
    update = {"path": "/nonexistent", "step": 10_000}
    return {
        "models, no key": status(port, "/v1/models", {}),
        "update, no token": status(port, "/update_weights", {}, update),
    }


def test_rl_serves_the_teacher_from_its_weights_and_distils_a_cut_down_smollm2(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """`teacher_weights`: rl starts the teacher's vLLM beside the student's, behind the run's API
    key and reload token, points the orchestrator at it with the key, and every trained token of
    every step is scored by it."""
    student = build_cut_down(tmp_path / "student")
    out, port = tmp_path / "run", free_port()
    overrides = (
        "--model.name", str(student), "--max-steps", str(STEPS),
        "--orchestrator.distill.teacher-weights", vllm_server.model,
        "--orchestrator.distill.teacher-port", str(port),
        "--orchestrator.eval.at_start", "false", "--orchestrator.eval.at_end", "false",
    )  # fmt: skip
    run = run_to_end(out, *overrides, config=RECIPE, timeout=900, while_running=partial(probe_teacher, port=port))
    run.check()
    # a local caller without the run's secrets can neither read the teacher nor swap its weights
    assert run.seen == {"models, no key": 401, "update, no token": 401}, run.seen
    assert f"server ready at http://127.0.0.1:{port} " in (out / "logs" / "launcher.log").read_text()
    assert (out / "logs" / "teacher.log").is_file() and (out / "configs" / "teacher.toml").is_file()
    records = metric_lines(out)
    assert sorted(m["step"] for m in records if "trainer/loss" in m) == list(range(STEPS))
    distill = {m["step"]: m for m in records if "distill/reverse_kl" in m}
    assert sorted(distill) == list(range(STEPS))
    trained = {m["step"]: m["train/trained_tokens"] for m in records if "train/trained_tokens" in m}
    for step, line in distill.items():  # the teacher scored every token the step trains
        assert line["distill/scored_tokens"] == trained[step] > 0
        assert math.isfinite(line["distill/reverse_kl"])
