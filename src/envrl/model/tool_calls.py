"""Tool calls per chat-template family: `family_of` names the syntax a template teaches, `parse` turns a completion
into OpenAI `tool_calls` (unparseable calls stay plain text for the env to answer); the tokens never change."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from envrl.data.traces import Message

Family = Literal["hermes", "llama3", "mistral"]

VLLM_TOOL_PARSERS: dict[Family, str] = {"hermes": "hermes", "llama3": "llama3_json", "mistral": "mistral"}
"""vLLM's `--tool-call-parser` for each family: the parser of the same syntax, so the chat API
(envrl's eval client, any OpenAI client) gets the calls the train client parses from tokens."""

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MISTRAL_NAMED = re.compile(
    r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]+)\[ARGS\]\s*(\{.*?\})(?=\s*\[TOOL_CALLS\]|\s*$)", re.DOTALL
)


TOOL_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "<|python_tag|>")
"""Tokens that open a tool call (or its arguments) in a family's syntax; some tokenizers make
them special tokens, which decoding for the calls must keep (model/chat_tokens.py)."""


class UnknownToolFormat(ValueError):
    """A model whose chat template teaches no tool-call syntax envrl parses was given tools."""


def family_of(chat_template: str) -> Family | None:
    """The tool-call family a chat template teaches, from the markers it renders (None: none known)."""
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3"
    return None


def families_written(text: str) -> set[Family]:
    """The families whose tool-call markers `text` holds (a Llama-3 call: a JSON object with a name)."""
    found: set[Family] = set()
    if "<tool_call>" in text:
        found.add("hermes")
    if "[TOOL_CALLS]" in text:
        found.add("mistral")
    body = text.strip()
    if "<|python_tag|>" in text or (body.startswith("{") and '"name"' in body):
        found.add("llama3")
    return found


def parse(text: str, family: Family) -> Message:
    """The assistant message for completion `text`: structured tool calls when the text holds
    well-formed ones in `family`'s syntax, else the text as it is."""
    calls = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral}[family](text)
    if calls is None:
        return {"role": "assistant", "content": text}
    content, found = calls
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [_openai_call(name, arguments, text, i) for i, (name, arguments) in enumerate(found)],
    }


Calls = tuple[str, list[tuple[str, Any]]]
"""The text outside the calls, and each call's (name, arguments)."""


def _hermes(text: str) -> Calls | None:
    bodies = _HERMES.findall(text)
    if not bodies or text.count("<tool_call>") != len(bodies):
        return None
    # Hermes writes one call object per tag; SmolLM2 a list of them (`<tool_call>[{...}, ...]</tool_call>`).
    objects = [item for body in bodies for item in _listed(_json(body))]
    found = [_named(item, "arguments") for item in objects]
    if not found or any(call is None for call in found):
        return None
    return _HERMES.sub("", text).strip(), [c for c in found if c is not None]


def _listed(data: Any) -> list[Any]:
    """A tag's call objects: the list it holds, or itself."""
    return data if isinstance(data, list) else [data]


def _llama3(text: str) -> Calls | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return None
    found = [_named(_json(part), "parameters", "arguments") for part in body.split(";")]
    if any(call is None for call in found):
        return None
    return "", [c for c in found if c is not None]


def _mistral(text: str) -> Calls | None:
    head, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return None
    named = _MISTRAL_NAMED.findall(marker + rest)
    if named:
        found = [(name, _json(arguments)) for name, arguments in named]
        if any(not isinstance(arguments, dict) for _, arguments in found):
            return None
        return head.strip(), found
    listed = _json(rest)
    if not isinstance(listed, list) or not listed:
        return None
    calls = [_named(item, "arguments") for item in listed]
    if any(call is None for call in calls):
        return None
    return head.strip(), [c for c in calls if c is not None]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _named(data: Any, *argument_keys: str) -> tuple[str, Any] | None:
    """(name, arguments) of a call object, or None if it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = next((data[key] for key in argument_keys if key in data), {})
    return (data["name"], arguments) if isinstance(arguments, dict) else None


def _openai_call(name: str, arguments: Any, text: str, index: int) -> dict[str, Any]:
    """An OpenAI tool call; its id is derived from the completion, so a rollout is reproducible."""
    digest = hashlib.blake2b(f"{index}:{text}".encode(), digest_size=6).hexdigest()
    return {"id": f"call_{digest}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
