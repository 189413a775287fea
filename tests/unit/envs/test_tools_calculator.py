"""calculator, the SmolLM2 tool-agent env: its tool evaluates integer arithmetic without `eval`
and refuses everything else with a reply, the reward pays only the exact product in the final
answer, and its demonstrations are real rollouts that load for `rl sft` with the cut-down
SmolLM2's tool template."""

import asyncio
import json
from pathlib import Path

import pytest
from calculator import MAX_EXPRESSION, Calculator, last_integer, load_environment
from calculator.demos import write_demos

from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig
from envrl.model.chat_tokens import chat_renderer
from envrl.model.smollm2 import build_cut_down
from envrl.trainer.sft.data import load_demonstrations


@pytest.mark.parametrize(("expression", "value"), [("347 * 29", "10063"), ("-(2 + 3) * 4 - 1", "-21"), (" 7 ", "7")])
def test_the_tool_evaluates_integer_arithmetic(expression: str, value: str) -> None:
    assert Calculator().calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "2 ** 10", "1 / 2", "1.5 * 2", "x * 2", "1 +", "9" * 40 + " * " + "9" * 40 + " * 9" * 20,
     "1+" * MAX_EXPRESSION],
)  # fmt: skip
def test_anything_else_is_refused_with_a_reply(expression: str) -> None:
    with pytest.raises(ValueError):
        Calculator().calculate(expression)


def test_the_last_integer_of_the_answer_is_read_with_digit_groups() -> None:
    assert last_integer("347 * 29 = 10,063.") == 10063
    assert last_integer("no number") is None


def call(expression: str) -> str:
    return f'<tool_call>[{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}]</tool_call>'


@pytest.mark.parametrize(
    ("replies", "reward", "calls"),
    [
        (["{a} * {b}", "The product is {p}."], 1.0, 1),  # the tool, then its result
        (["{a} * {b}", "It is {q}."], 0.0, 1),  # the tool, then a wrong answer
        (["I think {q}."], 0.0, 0),  # a guess at once
        (["{a} * {b}", "{a} * {b}", "{a} * {b}"], 0.0, 3),  # still calling at max_turns: no answer
    ],
)
def test_only_the_exact_product_in_the_final_answer_pays(replies: list[str], reward: float, calls: int) -> None:
    env = load_environment(num_train=2, max_turns=3)
    task = env.get_task("train", 0)
    fields = {"a": task.a, "b": task.b, "p": task.a * task.b, "q": task.a * task.b + 1}
    texts = [call(r.format(**fields)) if r.startswith("{a}") else r.format(**fields) for r in replies]
    trace = asyncio.run(env.run_rollout(task, ScriptedClient(ScriptedClientConfig(replies=texts)), SamplingArgs()))
    assert trace.error is None and trace.reward == reward
    assert trace.metrics.get("tool_calls", 0.0) == calls


def test_demonstrations_are_rollouts_that_load_for_sft_with_smollm2s_tool_template(tmp_path: Path) -> None:
    demos = write_demos(tmp_path / "demos.jsonl", count=32, tool_share=0.5, seed=0)
    with_tool = [d for d in demos if any(m["role"] == "tool" for m in d["messages"])]
    assert 8 <= len(with_tool) <= 24  # about half call the tool
    assert all(d["reward"] == 1.0 for d in with_tool)
    guesses = [d["reward"] for d in demos if d not in with_tool]  # exact only for a product that is a multiple of 100
    assert sum(guesses) <= len(guesses) / 4
    first_call = with_tool[0]["messages"][1]["tool_calls"][0]
    assert json.loads(first_call["function"]["arguments"])["expression"].count("*") == 1
    renderer = chat_renderer(str(build_cut_down(tmp_path / "model")))
    assert renderer.tool_family == "hermes"
    samples, stats = load_demonstrations(tmp_path / "demos.jsonl", renderer, seq_len=2048)
    assert len(samples) == 32 and stats.truncated == 0 and stats.dropped == 0
    text = renderer.tokenizer.decode(samples[demos.index(with_tool[0])].input_ids)
    assert "<tools>" in text and '<tool_call>[{"name": "calculate", "arguments": {"expression":' in text
