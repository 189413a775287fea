"""Tool environments from a plain class: schemas, strict argument checks, errors told to the model."""

import asyncio
import json
from typing import Any

import pytest

from envrl.data.traces import Task, Trace
from envrl.envs import Rubric, SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.envs.tools import ToolEnvironment, parse_tool_calls, tools_of
from tests.support.tiny_chat import TINY_CHAT


class Counter:
    """A tool class: public methods are tools; reset/close/_private are not."""

    instances: list["Counter"] = []

    def __init__(self) -> None:
        self.total = 0
        self.goal = 0
        self.done = False
        self.closed = False
        Counter.instances.append(self)

    def reset(self, goal: int, prompt: str) -> None:
        self.goal = goal

    def add(self, amount: int, note: str = "") -> int:
        """Add to the running total.

        Args:
            amount: How much to add; may be negative.
            note: A remark kept for
                nobody in particular.
        """
        self.total += amount
        return self.total

    async def divide(self, by: float) -> float:
        """Divide the total."""
        self.total = self.total / by
        return self.total

    def submit(self) -> str:
        """Finish the episode."""
        self.done = True
        return "submitted"

    def close(self) -> None:
        self.closed = True

    def _helper(self) -> None:
        raise AssertionError("private methods are not tools")


class GoalTask(Task):
    prompt: str
    goal: int


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def reached_goal(env: Counter, goal: int) -> float:
    return float(env.total == goal)


def run(*replies: str, max_turns: int = 6) -> Trace:
    tasks = [GoalTask(idx=0, prompt="reach 5", goal=5)]
    env = ToolEnvironment(tool_class=Counter, tasks=tasks, rubric=Rubric({reached_goal: 1.0}), max_turns=max_turns)
    client = ScriptedClient(ScriptedClientConfig(replies=list(replies), tokenizer=TINY_CHAT))
    return asyncio.run(
        env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=32), scoring_timeout=5.0)
    )


def tool_replies(trace: Trace) -> list[str]:
    """The tool messages the model was shown (up to its last turn)."""
    return [m["content"] for m in trace.turns[-1].prompt if m["role"] == "tool"]


def test_schemas_come_from_type_hints_and_docstrings() -> None:
    tools = tools_of(Counter)
    assert sorted(tools) == ["add", "divide", "submit"]
    add = tools["add"].schema["function"]
    assert add["name"] == "add" and add["description"] == "Add to the running total."
    assert add["parameters"] == {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "description": "How much to add; may be negative."},
            "note": {"type": "string", "default": "", "description": "A remark kept for nobody in particular."},
        },
        "required": ["amount"],
        "additionalProperties": False,
    }
    assert tools["divide"].schema["function"]["parameters"]["properties"]["by"] == {"type": "number"}


def test_a_tool_method_without_type_hints_is_rejected_with_its_name() -> None:
    class Untyped:
        def act(self, x):  # noqa: ANN001, ANN202
            return x

    with pytest.raises(TypeError, match="tool act: argument 'x' needs a type hint"):
        tools_of(Untyped)


def test_tool_calls_run_on_a_fresh_reset_instance_and_reward_reads_its_final_state() -> None:
    Counter.instances.clear()
    trace = run(call("add", amount=2), call("add", amount=3) + call("submit"), "never reached")
    assert trace.error is None and trace.stop_reason == "tool_ended" and trace.num_turns == 2
    assert tool_replies(trace) == ["2"]
    assert trace.reward == 1.0 and trace.metrics["tool_calls"] == 3.0
    [instance] = Counter.instances
    assert (instance.goal, instance.total, instance.done, instance.closed) == (5, 5, True, True)
    assert len(trace.branches) == 1  # tool turns extend the branch token by token


def test_invalid_arguments_are_not_coerced_but_reported_to_the_model() -> None:
    trace = run(call("add", amount="5"), call("add", amount=5, extra=1), call("add"), "I give up")
    replies = tool_replies(trace)
    assert len(replies) == 3 and all(r.startswith("Error: invalid arguments for add") for r in replies)
    assert "amount: Input should be a valid integer" in replies[0]
    assert "extra" in replies[1] and "amount: Field required" in replies[2]
    assert trace.reward == 0.0 and trace.metrics["tool_errors"] == 3.0 and trace.stop_reason == "completed"


def test_malformed_calls_unknown_tools_and_tool_exceptions_become_error_messages() -> None:
    trace = run(
        "<tool_call>{name: add}</tool_call>",
        call("multiply", x=2),
        call("divide", by=0),
        "<tool_call>" + json.dumps({"name": "add", "arguments": {"amount": 1}}),
        "done",
    )
    replies = tool_replies(trace)
    assert replies[0].startswith("Error: the tool call is not valid JSON")
    assert replies[1] == "Error: there is no tool 'multiply'; the tools are: add, divide, submit"
    assert replies[2].startswith("Error: ZeroDivisionError: ")
    assert replies[3] == "Error: a <tool_call> was opened but not closed with </tool_call>"
    assert trace.error is None and trace.metrics["tool_errors"] == 4.0


def test_max_turns_bounds_a_model_that_never_stops_calling_tools() -> None:
    trace = run(call("add", amount=1), max_turns=3)
    assert trace.num_turns == 3 and trace.stop_reason == "max_turns" and trace.is_truncated


def test_structured_openai_tool_calls_are_parsed_too() -> None:
    openai_call = {"id": "1", "type": "function", "function": {"name": "add", "arguments": '{"amount": 3}'}}
    message = {"role": "assistant", "content": "", "tool_calls": [openai_call]}
    [parsed] = parse_tool_calls(message)
    assert (parsed.name, parsed.arguments) == ("add", {"amount": 3})
    [bad] = parse_tool_calls({"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{oops"}}]})
    assert "must be a JSON object" in str(bad)


def test_tool_replies_carry_call_ids_turns_record_the_schemas_and_the_last_replies_are_kept() -> None:
    trace = run(call("add", amount=2), call("add", amount=3) + call("submit"), "never reached")
    [reply] = [m for m in trace.turns[1].prompt if m["role"] == "tool"]
    assert reply["tool_call_id"] == "call_1_0"
    assert [(m["tool_call_id"], m["content"]) for m in trace.trailing_messages][0] == ("call_2_0", "5")
    assert [m["tool_call_id"] for m in trace.trailing_messages] == ["call_2_0", "call_2_1"]
    assert all(turn.tools == [tool.schema for tool in tools_of(Counter).values()] for turn in trace.turns)
    [parsed] = parse_tool_calls(
        {"role": "assistant", "tool_calls": [{"id": "abc", "function": {"name": "add", "arguments": {}}}]}
    )
    assert parsed.id == "abc"


class Slow:
    """Tools that never answer in time: an async one that sleeps, one whose own TimeoutError is its error."""

    async def wait(self) -> str:
        """Wait for a long time."""
        await asyncio.sleep(3600)
        return "never"

    async def flaky(self) -> str:
        """Time out on its own."""
        raise TimeoutError("the backend timed out")


def test_an_async_tool_that_hangs_is_cancelled_at_tool_timeout_and_the_model_told() -> None:
    env = ToolEnvironment(tool_class=Slow, tasks=[GoalTask(idx=0, prompt="wait", goal=0)], tool_timeout=0.2)
    client = ScriptedClient(ScriptedClientConfig(replies=[call("wait") + call("flaky"), "ok"], tokenizer=TINY_CHAT))
    trace = asyncio.run(env.run_rollout(env.get_task("train", 0), client, SamplingArgs(max_tokens=32)))
    assert trace.error is None and trace.num_turns == 2 and trace.stop_reason == "completed"
    assert tool_replies(trace) == [
        "Error: TimeoutError: tool wait did not answer within 0.2s (tool_timeout)",
        "Error: TimeoutError: the backend timed out",
    ]


def test_the_share_of_turns_with_valid_calls_counts_parse_name_and_argument_errors_not_tool_errors() -> None:
    # valid (the tool raises: still a valid call) | bad JSON | unknown tool | bad arguments | valid | text
    trace = run(
        call("divide", by=0), "<tool_call>{x}</tool_call>", call("nope"), call("add", amount="1"), call("add", amount=5),
        "done",
    )  # fmt: skip
    assert trace.num_turns == 6 and trace.metrics["valid_tool_call_turns"] == 2.0
    assert trace.metrics["valid_tool_call_share"] == 2 / 6
    one_bad = run(call("add", amount=1) + call("nope"), "done")  # a turn is valid only if all its calls are
    assert one_bad.metrics["valid_tool_call_share"] == 0.0


def test_calls_in_the_mistral_and_llama3_syntax_run_and_malformed_ones_are_explained() -> None:
    trace = run(
        '[TOOL_CALLS][{"name": "add", "arguments": {"amount": 2}}]',
        '{"name": "add", "parameters": {"amount": 3}}',
        '[TOOL_CALLS][{"name": "add", "arguments": {amount: 2}}]',
        '<|python_tag|>{"name": "add", "parameters": [1]}',
        "done",
    )
    replies = tool_replies(trace)
    assert replies[:2] == ["2", "5"]
    assert replies[2].startswith('Error: the tool call does not parse (write [TOOL_CALLS][{"name": NAME')
    assert replies[3].startswith('Error: the tool call does not parse (write {"name": NAME, "parameters"')
    assert trace.error is None and trace.num_turns == 5 and trace.metrics["valid_tool_call_turns"] == 2.0
