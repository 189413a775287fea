"""Compiled vs eager decoder layers (and on CUDA varlen vs document_sdpa attention): logprobs
and gradients of a packed row of short samples and, on CUDA, of a row of samples long enough for
`document_varlen`'s per-sample sdpa path and of a row of groups sharing their prompts, on the
device at hand.

    python -m scripts.gpu.parity --device cuda     # bf16, what the GPU kit runs
    python -m scripts.gpu.parity --device cpu      # fp32

Guarantee: exits 0 only when every comparison is within its tolerance, and prints each one's
largest difference beside the tolerance. fp32 (CPU): 1e-4, as in tests/unit/trainer/test_compile.py.
bf16 (CUDA): a fused kernel keeps fp32 intermediates where eager rounds every op to bf16, so
the two differ by bf16's own rounding noise; the tolerance is that noise measured here, twice
the largest difference between the eager bf16 run and the same model in fp32.
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import envrl.trainer.model.attention as attention
import envrl.trainer.model.layout as layout
from envrl.trainer.model.compile import compile_layers, compile_plan
from envrl.trainer.model.head import install_logprob_head
from envrl.trainer.packing import MicroBatch, pack, packed_token_logprobs
from tests.support.samples import synthetic_samples

VOCAB = 4096


def model(attn: str, dtype: torch.dtype, device: torch.device, compiled: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        attn_implementation=attn,
    )
    m = Qwen3ForCausalLM(config).to(device=device, dtype=dtype)
    install_logprob_head(m)
    if compiled:
        compile_layers(m, compile_plan(True, device, 0))
    return m


def scores(m: Qwen3ForCausalLM, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [T], the gradient of their sum w.r.t. the last layer's down_proj, flattened), fp32."""
    logprobs, _ = packed_token_logprobs(m, mb)
    weight = m.model.layers[-1].mlp.down_proj.weight
    (grad,) = torch.autograd.grad(logprobs.sum(), weight)
    return logprobs.detach().float(), grad.float().flatten()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    short = synthetic_samples(8, prompt_len=(16, 64), completion_len=(64, 300), vocab_size=VOCAB)
    rows_ok = [compare("8 short samples", short, dtype, device)]
    # groups of 4 sharing a prompt: each prompt once, its completions in masked sdpa calls after it
    groups = synthetic_samples(12, prompt_len=(200, 300), completion_len=(16, 200), vocab_size=VOCAB, group_size=4)
    rows_ok.append(compare("3 groups of 4 sharing a prompt (shared prefixes)", groups, dtype, device, share=True))
    if device.type == "cuda":  # samples >= SDPA_FROM_TOKENS: document_varlen's per-sample sdpa calls
        n = layout.SDPA_FROM_TOKENS
        long = synthetic_samples(2, prompt_len=(16, 16), completion_len=(n, n), vocab_size=VOCAB)
        rows_ok.append(compare(f"2 samples of {n + 16} tokens (per-sample sdpa)", long, dtype, device))
        mixed = [*short[:3], long[0], *short[3:]]
        rows_ok.append(compare("3 short, 1 long, 5 short (varlen, sdpa, varlen)", mixed, dtype, device))
    return 0 if all(rows_ok) else 1


def compare(title: str, samples: list, dtype: torch.dtype, device: torch.device, share: bool = False) -> bool:
    """Compiled vs eager, and document_varlen vs document_sdpa, on one packed row of `samples`
    (with `share`, packed with shared prefixes, which both attentions run)."""
    (mb,) = pack(samples, 1 << 20, "token", share_prefixes=share)
    mb = mb.to(device)
    sdpa = attention.DOCUMENT_SDPA
    eager = scores(model(sdpa, dtype, device, compiled=False), mb)
    if dtype == torch.float32:
        tolerance = (1e-4, 1e-4 * eager[1].abs().max().item())
    else:
        exact = scores(model(sdpa, torch.float32, device, compiled=False), mb)
        tolerance = tuple(2 * (e - x).abs().max().item() for e, x in zip(eager, exact, strict=True))
    rows = [("compiled vs eager", scores(model(sdpa, dtype, device, compiled=True), mb))]
    if attention.resolve_attn_implementation("auto", device, dtype) == attention.DOCUMENT_VARLEN:
        rows.append(
            ("document_varlen vs document_sdpa", scores(model(attention.DOCUMENT_VARLEN, dtype, device, False), mb))
        )
    else:
        print(f"document_varlen: not run ({device.type}, {dtype}: `auto` attention here is not varlen)")
    ok = True
    print(
        f"{title}: device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), {dtype}, {mb.num_tokens} tokens in {mb.num_samples} samples"
    )
    print(
        "| comparison | max |logprob diff| | tolerance | max |grad diff| | tolerance | ok |\n|---|---|---|---|---|---|"
    )
    for name, got in rows:
        diffs = [(g - e).abs().max().item() for g, e in zip(got, eager, strict=True)]
        passed = all(d <= t for d, t in zip(diffs, tolerance, strict=True))
        ok &= passed
        print(
            f"| {name} | {diffs[0]:.3g} | {tolerance[0]:.3g} | {diffs[1]:.3g} | {tolerance[1]:.3g} | {'yes' if passed else 'NO'} |"
        )
    return ok


if __name__ == "__main__":
    sys.exit(main())
