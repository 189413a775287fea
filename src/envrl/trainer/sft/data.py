"""SFT demonstrations (JSONL of `{"messages", "tools"}`): the model's own template renders each conversation and
only assistant tokens are trained; a conversation with no honest mask is an error naming file, line and message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envrl.data.samples import TrainingSample
from envrl.model.chat_tokens import ChatRenderer

SFT_ENV = "sft"
"""The `env` tag of SFT samples (metrics and packing warnings name it)."""

ROLES = ("system", "user", "assistant", "tool")


class DemonstrationError(ValueError):
    """A demonstrations file that cannot be trained on; the message names file, line and why."""


@dataclass
class DemonstrationStats:
    conversations: int = 0
    truncated: int = 0
    """Conversations cut at `seq_len` (their later assistant tokens are not trained)."""
    dropped: int = 0
    """Conversations left with no assistant token inside `seq_len` (not trained at all)."""
    trained_tokens: int = 0


def load_demonstrations(
    path: Path, renderer: ChatRenderer, seq_len: int
) -> tuple[list[TrainingSample], DemonstrationStats]:
    """Every conversation of the JSONL file `path` as one sample of at most `seq_len` tokens."""
    if not path.is_file():
        raise DemonstrationError(f"no demonstrations file at {path} (data = ...; one JSON conversation per line)")
    samples: list[TrainingSample] = []
    stats = DemonstrationStats()
    with path.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            messages, tools = _parse(line, where)
            ids, mask = assistant_mask(renderer, messages, tools, where)
            stats.conversations += 1
            if len(ids) > seq_len:
                ids, mask = ids[:seq_len], mask[:seq_len]
                stats.truncated += 1
            if not any(mask):
                stats.dropped += 1
                continue
            stats.trained_tokens += sum(mask)
            samples.append(
                TrainingSample(
                    input_ids=ids,
                    loss_mask=mask,
                    inference_logprobs=[0.0] * len(ids),
                    advantage=1.0,
                    env=SFT_ENV,
                    task_idx=number,
                    policy_step=0,
                )
            )
    if not samples:
        raise DemonstrationError(f"{path} holds no conversation with an assistant token inside seq_len = {seq_len}")
    return samples, stats


def assistant_mask(
    renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, where: str
) -> tuple[list[int], list[int]]:
    """Tokens of the whole conversation and a mask that is 1 on each assistant message's tokens:
    from where the template's generation prompt ends to where that message's rendering ends."""
    ids = renderer.render(messages, tools, generation_prompt=False)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = renderer.render(messages[:i], tools, generation_prompt=True)
        through = renderer.render(messages[: i + 1], tools, generation_prompt=False)
        if through[: len(before)] != before or ids[: len(through)] != through:
            raise DemonstrationError(
                f"{where}: message {i}: the chat template of {renderer.tokenizer_dir} does not render this "
                "conversation's turns as prefixes of the whole (it rewrites earlier turns, e.g. drops past "
                "reasoning), so the assistant tokens cannot be masked exactly; split the conversation into "
                "one line per assistant turn"
            )
        mask[len(before) : len(through)] = [1] * (len(through) - len(before))
    return ids, mask


def _parse(line: str, where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DemonstrationError(f"{where}: not JSON ({e})") from e
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise DemonstrationError(f'{where}: expected {{"messages": [...], "tools": [...]}} (tools optional)')
    messages = record["messages"]
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise DemonstrationError(
                f"{where}: message {i} needs a role among {', '.join(ROLES)} (got {message!r:.80})"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise DemonstrationError(f"{where}: no assistant message, so nothing to learn from")
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise DemonstrationError(f"{where}: tools must be a list of tool schemas")
    return messages, tools
