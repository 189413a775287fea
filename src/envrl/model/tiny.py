"""Models built offline for debug runs and tests: `build_tiny_model` and `build_qwen3_model` write the same bytes
for the same seed, plain HF directories. Usage: `python -m envrl.model.tiny [--out DIR] [--seed N] [--shape NAME]`."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

MODELS_DIR = Path("deps") / "models"
"""Where `main` writes by default, relative to the current directory: run from a checkout's root, it
rebuilds the models the repo ships (tiny-chat, seed 0, which configs name as `model.name`)."""

QWEN3_SHAPES: dict[str, dict[str, int]] = {
    "qwen3-0.6b": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "qwen3-tiny": {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
    },
}
"""Qwen3 shapes: Qwen3-0.6B's published config (its tied 151,936-token embedding included: the
lm_head is a quarter of its matmul parameters; ids past the tiny tokenizer's ~1k decode to empty
text), and the same architecture at the tiny model's size (the tokenizer's vocabulary) for CPU
smoke runs of the GPU kit."""

PAD, BOS_TURN, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
VOCAB_SIZE = 1024

CHAT_TEMPLATE = (
    "{%- set ns = namespace(first=0) -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- messages[0].content + '\\n\\n' -}}{%- set ns.first = 1 -%}"
    "{%- endif -%}"
    '{{- \'You can call tools. To call one, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.\\n'
    "Tools:\\n' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool.function if tool.function is defined else tool) | tojson + '\\n' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.first:] -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- set args = fn.arguments if fn.arguments is string else fn.arguments | tojson -%}"
    "{{- '<tool_call>{\"name\": ' + fn.name | tojson + ', \"arguments\": ' + args + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORDS = [
    "the",
    "a",
    "an",
    "and",
    "or",
    "not",
    "to",
    "of",
    "in",
    "on",
    "at",
    "for",
    "with",
    "from",
    "by",
    "is",
    "are",
    "was",
    "be",
    "it",
    "this",
    "that",
    "you",
    "i",
    "we",
    "they",
    "what",
    "which",
    "who",
    "how",
    "why",
    "when",
    "where",
    "yes",
    "no",
    "true",
    "false",
    "reverse",
    "text",
    "string",
    "word",
    "letter",
    "number",
    "answer",
    "question",
    "please",
    "write",
    "say",
    "repeat",
    "copy",
    "sort",
    "count",
    "add",
    "sum",
    "total",
    "guess",
    "higher",
    "lower",
    "correct",
    "wrong",
    "right",
    "left",
    "up",
    "down",
    "first",
    "last",
    "next",
    "value",
    "key",
    "store",
    "get",
    "set",
    "call",
    "tool",
    "result",
    "error",
    "done",
    "start",
    "end",
    "game",
    "score",
    "reward",
    "task",
    "step",
    "turn",
    "user",
    "assistant",
    "system",
    "function",
    "name",
    "arguments",
    "json",
    "list",
    "dict",
    "null",
]


def _training_corpus() -> list[str]:
    """A fixed corpus: chat markup, JSON tool calls, English words, digits and letters."""
    lines = [f"{BOS_TURN}{role}\n" for role in ("system", "user", "assistant", "tool")]
    lines += ['{"name": "add", "arguments": {"a": 1, "b": 2}}', '{"type": "function", "function": {}}']
    lines += [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 3)]
    lines += [" ".join(str(n) for n in range(start, start + 50)) for start in range(0, 1000, 50)]
    lines += ["".join(chars) for chars in itertools.permutations("abcdefgh", 3)]
    lines += [word.capitalize() + "." for word in _WORDS]
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 2,  # two non-special added tokens for tool calls come after
        special_tokens=[PAD, BOS_TURN, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    tokenizer.add_tokens([TOOL_OPEN, TOOL_CLOSE])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.do_sample = True
    return model


def qwen3_config(shape: str, tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    if shape not in QWEN3_SHAPES:
        raise ValueError(f"unknown Qwen3 shape {shape!r}; known: {sorted(QWEN3_SHAPES)}")
    return Qwen3Config(
        **{"vocab_size": len(tokenizer), **QWEN3_SHAPES[shape]},
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )


def build_qwen3_model(out_dir: Path, shape: str = "qwen3-0.6b", seed: int = 0) -> Path:
    """Write a Qwen3 model of `shape` with random bf16 weights and the tiny tokenizer to `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = qwen3_config(shape, tokenizer)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.do_sample = True
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    build = {"builder": "src/envrl/model/tiny.py", "shape": shape, "seed": seed}
    (out_dir / "envrl_build.json").write_text(json.dumps(build) + "\n")
    return out_dir


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer to `out_dir` (created or overwritten) and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out_dir)
    build_model(tokenizer, seed).save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "envrl_build.json").write_text(json.dumps({"builder": "src/envrl/model/tiny.py", "seed": seed}) + "\n")
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description="Build an offline model (same shape and seed, same bytes).")
    parser.add_argument("--shape", choices=["tiny-chat", *QWEN3_SHAPES], default="tiny-chat")
    parser.add_argument(
        "--out", type=Path, help=f"output directory (default: {MODELS_DIR}/tiny-chat, or {MODELS_DIR}/<shape>-random)"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight-initialisation seed (default: 0)")
    args = parser.parse_args()
    if args.shape == "tiny-chat":
        out = build_tiny_model(args.out or MODELS_DIR / "tiny-chat", args.seed)
    else:
        out = build_qwen3_model(args.out or MODELS_DIR / f"{args.shape}-random", args.shape, args.seed)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {args.shape} model (seed {args.seed}) to {out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
