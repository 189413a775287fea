"""Chat messages to prompt ids with the model's own template: a turn that continues its branch gets exactly the
previous prompt + completion + the turn's closing tokens + the new messages; earlier turns are never re-tokenised."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from envrl.data.traces import Message, Turn
from envrl.model.tool_calls import TOOL_MARKERS, UnknownToolFormat, family_of
from envrl.model.tool_calls import parse as parse_tool_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


class ChatRenderer:
    """The model's tokenizer (its tokenizer.json) and chat template; share it via `chat_renderer`."""

    def __init__(self, tokenizer_dir: str) -> None:
        # The fast tokenizer class alone, not AutoTokenizer: it does not import torch, which keeps
        # env workers a fraction of the size (docs/measurements.md) and their forks for scoring cheap.
        from transformers import PreTrainedTokenizerFast

        self.tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        if self.tokenizer.chat_template is None:
            raise ValueError(f"the tokenizer in {tokenizer_dir} has no chat template; the train client needs one")
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"the tokenizer in {tokenizer_dir} has no eos token; the train client needs one")
        self.eos_id: int = eos
        self.tool_family = family_of(self.tokenizer.chat_template)
        """How the template asks the model to call tools (None: it teaches no syntax envrl parses)."""
        special = set(self.tokenizer.all_special_tokens) | {
            t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special
        }
        self._markers: dict[int, str] = {
            self.tokenizer.convert_tokens_to_ids(marker): marker for marker in TOOL_MARKERS if marker in special
        }
        """Tool-call markers that are special tokens in this tokenizer (Mistral's `[TOOL_CALLS]`,
        Llama-3's `<|python_tag|>`): kept when a completion is decoded for its tool calls."""
        self.tokenizer_dir = tokenizer_dir

    def assistant_message(self, completion_ids: list[int], tools: list[dict[str, Any]] | None) -> Message:
        """The assistant message of a completion: its text, with structured `tool_calls` when the
        model was shown tools and wrote calls in its family's syntax (model/tool_calls.py)."""
        if not tools:
            return {"role": "assistant", "content": self.decode(completion_ids)}
        if self.tool_family is None:
            raise UnknownToolFormat(
                f"the chat template of {self.tokenizer_dir} teaches no tool-call syntax envrl parses "
                "(hermes <tool_call>, llama3 JSON, mistral [TOOL_CALLS]), yet the model was given tools; "
                "use a model whose template renders tools, or an env without tools"
            )
        return parse_tool_calls(self._decode_keeping_markers(completion_ids), self.tool_family)

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """The visible text of a completion: special tokens such as eos are dropped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _decode_keeping_markers(self, ids: list[int]) -> str:
        """`decode`, except that tool-call markers which are special tokens stay in the text, so
        the family's parser sees them (every other special token is still dropped)."""
        if not self._markers or not any(i in self._markers for i in ids):
            return self.decode(ids)
        parts, start = [], 0
        for at, token in enumerate(ids):
            if token in self._markers:
                parts += [self.decode(ids[start:at]), self._markers[token]]
                start = at + 1
        return "".join([*parts, self.decode(ids[start:])])

    def prompt_ids(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, previous: Turn | None
    ) -> list[int]:
        """Prompt ids for `messages`, extending `previous` (the branch's last turn) where it can."""
        extended = self.extend(messages, tools, previous) if previous is not None else None
        return extended if extended is not None else self.render(messages, tools, generation_prompt=True)

    def extend(self, messages: list[Message], tools: list[dict[str, Any]] | None, previous: Turn) -> list[int] | None:
        """previous prompt + completion + turn closer + new messages, or None if not an extension."""
        if previous.tokens is None:
            return None
        seen = [*previous.prompt, previous.response]
        if len(messages) <= len(seen) or messages[: len(seen)] != seen:
            return None
        without = self.render(seen, tools, generation_prompt=False)
        with_new = self.render(messages, tools, generation_prompt=True)
        if with_new[: len(without)] != without:
            return None  # the template renders earlier messages differently once more follow
        closer = self._turn_closer(without)
        if closer is None:
            return None
        completion = previous.tokens.completion_ids
        if not completion or completion[-1] != self.eos_id:
            # Cut off by max_tokens or a stop string: the template's eos still closes the turn.
            closer = [self.eos_id, *closer]
        return [*previous.tokens.prompt_ids, *completion, *closer, *with_new[len(without) :]]

    def _turn_closer(self, rendered: list[int]) -> list[int] | None:
        """Tokens the template puts after the assistant's eos (ChatML: the `\\n` after `<|im_end|>`).

        The model stops at eos, so these never appear in its completion, yet the next message is
        rendered after them; they join the next prompt as context tokens (loss-masked).
        """
        if self.eos_id not in rendered:
            return None
        last_eos = len(rendered) - 1 - rendered[::-1].index(self.eos_id)
        return rendered[last_eos + 1 :]


@lru_cache(maxsize=8)
def chat_renderer(tokenizer_dir: str) -> ChatRenderer:
    """One renderer per tokenizer directory per process: loading a tokenizer is too slow to repeat per rollout."""
    return ChatRenderer(tokenizer_dir)
