"""Tool calls in generated text, per family: structured when well-formed, plain text otherwise."""

import json

import pytest

from envrl.model.tool_calls import family_of, parse


def calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def test_hermes_calls_become_structured_with_the_text_around_them_kept() -> None:
    text = 'Let me look.<tool_call>{"name": "get", "arguments": {"key": "a"}}</tool_call>\n<tool_call>{"name": "put", "arguments": {"key": "b", "value": 1}}</tool_call>'
    message = parse(text, "hermes")
    assert message["content"] == "Let me look."
    assert calls(message) == [("get", {"key": "a"}), ("put", {"key": "b", "value": 1})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == 2


def test_smollm2_writes_a_list_of_calls_in_one_hermes_tag() -> None:
    text = '<tool_call>[{"name": "calculate", "arguments": {"expression": "3 * 4"}}, {"name": "get", "arguments": {}}]</tool_call>'
    assert calls(parse(text, "hermes")) == [("calculate", {"expression": "3 * 4"}), ("get", {})]


def test_llama3_json_calls_with_or_without_the_python_tag() -> None:
    assert calls(parse('{"name": "get", "parameters": {"key": "a"}}', "llama3")) == [("get", {"key": "a"})]
    two = '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 2}}'
    assert calls(parse(two, "llama3")) == [("a", {}), ("b", {"x": 2})]


def test_mistral_calls_in_the_list_and_the_named_syntax() -> None:
    listed = '[TOOL_CALLS][{"name": "get", "arguments": {"key": "a"}}]'
    assert calls(parse(listed, "mistral")) == [("get", {"key": "a"})]
    named = '[TOOL_CALLS]get[ARGS]{"key": "a"}[TOOL_CALLS]put[ARGS]{"key": "b"}'
    assert calls(parse(named, "mistral")) == [("get", {"key": "a"}), ("put", {"key": "b"})]


@pytest.mark.parametrize(
    ("text", "family"),
    [
        ("just an answer", "hermes"),
        ('<tool_call>{"name": "get", "arguments": {bad json}</tool_call>', "hermes"),
        ('<tool_call>{"name": "get", "arguments": {}}', "hermes"),  # never closed
        ('<tool_call>{"arguments": {}}</tool_call>', "hermes"),  # no name
        ("<tool_call>[]</tool_call>", "hermes"),  # an empty list of calls
        ('<tool_call>[{"name": "get", "arguments": {}}, 3]</tool_call>', "hermes"),  # a list with a non-call
        ('{"name": "get", "parameters": [1]}', "llama3"),
        ("[TOOL_CALLS]not json", "mistral"),
    ],
)
def test_a_completion_without_well_formed_calls_stays_text_for_the_env_to_answer(text: str, family: str) -> None:
    assert parse(text, family) == {"role": "assistant", "content": text}  # type: ignore[arg-type]


def test_the_ids_are_a_function_of_the_completion() -> None:
    text = '<tool_call>{"name": "get", "arguments": {}}</tool_call>'
    assert parse(text, "hermes") == parse(text, "hermes")


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("... write <tool_call>{...}</tool_call> ...", "hermes"),
        ("{{ '[TOOL_CALLS]' + calls }}", "mistral"),
        ("{%- if message.role == 'ipython' %}<|python_tag|>", "llama3"),
        ("{{ message.content }}", None),
    ],
)
def test_the_family_comes_from_the_markers_the_template_renders(template: str, family: str | None) -> None:
    assert family_of(template) == family
