"""The tiny offline chat model: deterministic build, loads in transformers, generates, chats."""

import hashlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from envrl.model.tiny import build_qwen3_model, build_tiny_model, build_tokenizer, qwen3_config
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


def digests(directory: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir())}


def test_shipped_model_is_the_seed_0_build(tmp_path: Path) -> None:
    """Same seed, same bytes, and the committed copy is exactly what the builder makes."""
    built = build_tiny_model(tmp_path / "seed0", seed=0)
    assert digests(built) == digests(DEFAULT_DIR)


def test_different_seed_gives_different_weights(tmp_path: Path) -> None:
    built = build_tiny_model(tmp_path / "seed1", seed=1)
    assert digests(built)["model.safetensors"] != digests(DEFAULT_DIR)["model.safetensors"]
    assert digests(built)["tokenizer.json"] == digests(DEFAULT_DIR)["tokenizer.json"]


def test_qwen3_0_6b_shape_has_the_published_parameter_counts() -> None:
    """Qwen3-0.6B's model card: 0.6B parameters, 0.44B without the (tied) embedding."""
    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config("qwen3-0.6b", build_tokenizer()))
    total = sum(p.numel() for p in model.parameters())
    assert (total, total - model.get_input_embeddings().weight.numel()) == (596_049_920, 440_467_456)


def test_qwen3_tiny_builds_the_same_bytes_and_loads(tmp_path: Path) -> None:
    first = build_qwen3_model(tmp_path / "a", "qwen3-tiny", seed=0)
    assert digests(first) == digests(build_qwen3_model(tmp_path / "b", "qwen3-tiny", seed=0))
    model = AutoModelForCausalLM.from_pretrained(first)
    assert model.config.model_type == "qwen3" and model.dtype == torch.bfloat16
    assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, len(build_tokenizer()))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_DIR)


def test_loads_and_generates(tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR)
    assert model.config.head_dim == 32 and model.config.num_hidden_layers == 2
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(0)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=True)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_special_tokens(tokenizer) -> None:
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert len(tokenizer) == 1024
    assert tokenizer.decode(tokenizer.encode("Reverse: héllo wörld 123")) == "Reverse: héllo wörld 123"


def test_chat_template_without_tools(tokenizer) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_renders_tools_and_tool_calls(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        },
        {"role": "tool", "content": "3"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and '"name": "add"' in text and "Add two integers." in text
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>\n'
        in text
    )
    assert text.endswith("<|im_start|>tool\n3<|im_end|>\n")
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("<tool_call>")) == ["<tool_call>"]


def test_chat_template_accepts_openai_string_arguments(tokenizer) -> None:
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1}'}}]}
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in text
