"""Token extension across turns: the next prompt is previous prompt + completion + new messages."""

from envrl.data.traces import Turn, TurnTokens
from envrl.model.chat_tokens import chat_renderer
from tests.support.tiny_chat import TINY_CHAT

RENDERER = chat_renderer(TINY_CHAT)
TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}},
    }
]


def first_turn(reply: str, stopped: bool = True, tools: list | None = None) -> Turn:
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say 3 4 5"}]
    completion = RENDERER.encode(reply) + ([RENDERER.eos_id] if stopped else [])
    return Turn(
        prompt=prompt,
        response={"role": "assistant", "content": reply},
        tokens=TurnTokens(
            prompt_ids=RENDERER.render(prompt, tools, generation_prompt=True),
            completion_ids=completion,
            completion_logprobs=[-1.0] * len(completion),
        ),
        finish_reason="stop" if stopped else "length",
    )


def test_next_prompt_extends_previous_prompt_and_completion() -> None:
    turn = first_turn("3 4 5")
    messages = [*turn.prompt, turn.response, {"role": "user", "content": "Higher."}]
    ids = RENDERER.prompt_ids(messages, None, turn)
    before = turn.tokens.prompt_ids + turn.tokens.completion_ids
    assert ids[: len(before)] == before
    # What the model never emitted (the "\n" after <|im_end|>) is bridged; the rest is the new message.
    assert (
        RENDERER.tokenizer.decode(ids[len(before) :])
        == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    )
    # With this template, extending is exactly what a fresh render of the whole chat gives.
    assert ids == RENDERER.render(messages, None, generation_prompt=True)


def test_earlier_completion_tokens_are_kept_even_when_retokenising_would_differ() -> None:
    turn = first_turn("3 4 5")
    odd = [RENDERER.encode(c)[0] for c in "345"]  # "3","4","5" as single-character tokens: not how encode splits " 4"
    turn.tokens = TurnTokens(
        prompt_ids=turn.tokens.prompt_ids, completion_ids=[*odd, RENDERER.eos_id], completion_logprobs=[-1.0] * 4
    )
    turn.response = {"role": "assistant", "content": "345"}
    ids = RENDERER.prompt_ids([*turn.prompt, turn.response, {"role": "user", "content": "again"}], None, turn)
    assert ids[: len(turn.tokens.prompt_ids) + 4] == turn.tokens.prompt_ids + turn.tokens.completion_ids


def test_a_completion_cut_off_by_max_tokens_is_closed_with_eos() -> None:
    turn = first_turn("3 4", stopped=False)
    ids = RENDERER.prompt_ids([*turn.prompt, turn.response, {"role": "user", "content": "More."}], None, turn)
    before = turn.tokens.prompt_ids + turn.tokens.completion_ids
    assert ids[: len(before)] == before
    assert ids[len(before) : len(before) + 2] == [RENDERER.eos_id, *RENDERER.encode("\n")]


def test_tool_prompts_extend_too() -> None:
    turn = first_turn('<tool_call>{"name": "add", "arguments": {}}</tool_call>', tools=TOOLS)
    messages = [*turn.prompt, turn.response, {"role": "tool", "content": "7"}]
    ids = RENDERER.prompt_ids(messages, TOOLS, turn)
    assert (
        ids[: len(turn.tokens.prompt_ids) + len(turn.tokens.completion_ids)]
        == turn.tokens.prompt_ids + turn.tokens.completion_ids
    )
    assert ids == RENDERER.render(messages, TOOLS, generation_prompt=True)


def test_rewritten_history_is_rendered_afresh() -> None:
    turn = first_turn("3 4 5")
    compacted = [{"role": "user", "content": "Summary so far: 3 4 5"}, {"role": "user", "content": "Go on."}]
    assert RENDERER.extend(compacted, None, turn) is None
    assert RENDERER.prompt_ids(compacted, None, turn) == RENDERER.render(compacted, None, generation_prompt=True)


def test_a_turn_without_tokens_cannot_be_extended() -> None:
    turn = first_turn("3 4 5")
    turn.tokens = None
    assert RENDERER.extend([*turn.prompt, turn.response, {"role": "user", "content": "x"}], None, turn) is None


MISTRAL_TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- else %}{{ m.content }}{%- endif %}{%- endfor %}"
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- if false %}[TOOL_CALLS]{%- endif %}"
)


def test_tool_call_markers_that_are_special_tokens_survive_decoding(tmp_path) -> None:
    """Mistral's tokenizers make `[TOOL_CALLS]` a special token: the calls still parse, and the
    eos after them is still dropped."""
    tokenizer = RENDERER.tokenizer.__class__.from_pretrained(TINY_CHAT)
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    tokenizer.chat_template = MISTRAL_TEMPLATE
    tokenizer.save_pretrained(tmp_path)
    renderer = chat_renderer(str(tmp_path))
    ids = [
        *renderer.encode("Sure."),
        renderer.tokenizer.convert_tokens_to_ids("[TOOL_CALLS]"),
        *renderer.encode('[{"name": "add", "arguments": {"a": 1}}]'),
        renderer.eos_id,
    ]
    message = renderer.assistant_message(ids, TOOLS)
    assert message["content"] == "Sure."
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["add"]
    assert renderer.decode(ids) == 'Sure.[{"name": "add", "arguments": {"a": 1}}]'  # visible text: no markers
