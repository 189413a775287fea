"""Tool calls over the chat API: unless `inference.vllm` says otherwise, a model whose template teaches a known
tool-call syntax is served with its family's vLLM parser, so chat requests with `tools` get structured `tool_calls`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loguru import logger

from envrl.model.tool_calls import VLLM_TOOL_PARSERS, family_of

USER_KEYS = ("tool_call_parser", "enable_auto_tool_choice")
"""`inference.vllm` keys that, when set, leave tool-call serving to the user."""


def chat_template(model: str, vllm_options: dict[str, Any]) -> str | None:
    """The chat template vLLM will render with: `chat_template` (a file or the template itself)
    if given, else the tokenizer's (`tokenizer`, else the model's directory); None if unreadable."""
    if given := vllm_options.get("chat_template"):
        path = Path(str(given))
        return path.read_text() if path.is_file() else str(given)
    from transformers import PreTrainedTokenizerFast

    source = str(vllm_options.get("tokenizer") or model)
    try:
        template = PreTrainedTokenizerFast.from_pretrained(source).chat_template
    except (OSError, ValueError) as e:
        logger.warning(f"chat tool calls are not served: cannot read the chat template of {source} ({e})")
        return None
    return template if isinstance(template, str) else None


def chat_tool_options(model: str, vllm_options: dict[str, Any]) -> dict[str, Any]:
    """vLLM options that serve chat tool calls in `model`'s family (empty: none to add)."""
    if any(key in vllm_options for key in USER_KEYS):
        return {}
    template = chat_template(model, vllm_options)
    family = family_of(template) if template else None
    if family is None:
        if template is not None:
            logger.info(
                f"chat tool calls are not served: the chat template of {model} teaches no tool-call syntax envrl "
                "knows (hermes, llama3, mistral); set inference.vllm.tool_call_parser and "
                "inference.vllm.enable_auto_tool_choice = true to serve them with a vLLM parser"
            )
        return {}
    parser = VLLM_TOOL_PARSERS[family]
    logger.info(
        f"chat tool calls: vLLM's {parser!r} parser (the chat template's {family} family); "
        "set inference.vllm.tool_call_parser to choose another"
    )
    return {"enable_auto_tool_choice": True, "tool_call_parser": parser}
