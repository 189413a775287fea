"""Compiled decoder layers train the same model: logprobs and gradients match eager mode."""

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import envrl.trainer.model.attention  # noqa: F401  (registers document_sdpa)
from envrl.trainer.model.compile import CPU_COMPILE_MIN_PARAMS, compile_layers, compile_plan, compiler_missing
from envrl.trainer.model.head import install_logprob_head
from envrl.trainer.packing import pack, packed_token_logprobs
from tests.support.samples import synthetic_samples

CPU = torch.device("cpu")


def test_auto_compiles_on_cpu_only_past_the_debug_models():
    assert not compile_plan("auto", CPU, 200_000).enabled
    assert compile_plan("auto", CPU, CPU_COMPILE_MIN_PARAMS).enabled == (compiler_missing(CPU) is None)
    assert compile_plan(True, CPU, 200_000).enabled == (compiler_missing(CPU) is None)
    assert not compile_plan(False, CPU, 10**10).enabled


def test_without_a_compiler_the_layers_run_eagerly_and_say_why(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CXX", "no-such-g++")
    plan = compile_plan(True, CPU, 10**9)
    assert not plan.enabled
    assert "no C++ compiler" in plan.reason and "eagerly" in plan.reason


def small_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attn_implementation="document_sdpa",
    )
    return LlamaForCausalLM(config)


@pytest.mark.skipif(compiler_missing(CPU) is not None, reason="no C++ compiler for inductor")
def test_compiled_layers_give_eager_logprobs_and_gradients(tmp_path, monkeypatch):
    monkeypatch.setitem(os.environ, "TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    samples = synthetic_samples(4, prompt_len=(3, 6), completion_len=(8, 20), vocab_size=256)
    (mb,) = pack(samples, 4096, "token")

    def run(model):
        logprobs, entropy = packed_token_logprobs(model, mb)
        logprobs.sum().backward()
        return logprobs.detach(), entropy, {n: p.grad for n, p in model.named_parameters()}

    eager = small_model()
    compiled = small_model()
    for model in (eager, compiled):
        install_logprob_head(model)
    assert compile_layers(compiled, compile_plan(True, CPU, 0)) == 2
    want, want_entropy, want_grads = run(eager)
    got, got_entropy, got_grads = run(compiled)
    # fp32. Inductor fuses the elementwise ops (RMSNorm, rotary, SiLU * up) and may reorder their
    # reductions (the RMSNorm mean over 64 features); each such op then differs from eager by a
    # few ulps (~1e-7 relative), and two layers and a 256-way log-softmax carry that to the
    # logprobs (|logprob| <= ~10) as ~1e-6 absolute. The gradients are sums over ~60 tokens of
    # such products: ~1e-5 relative. 1e-4 / 1e-4 leaves an order of magnitude of margin; a real
    # difference in what is computed (a missed mask, a wrong layout) is O(1).
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-4, rtol=1e-4)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
