"""calculator: multiply a three-digit by a two-digit number, with a `calculate` tool at hand.

Guarantee: the one tool evaluates integer arithmetic (+, -, *, parentheses) of at most
`MAX_EXPRESSION` characters by walking its syntax tree, never `eval`: any other expression is an
error reply the model can act on. The reward reads only the rollout: 1 when the last integer of
the model's final answer is the product, else 0 (a final turn that still calls a tool has no
answer). Tasks are a pure function of (count, seed); the eval split uses seed + 1.

Why the tool is needed: SmolLM2-135M-Instruct cannot multiply 347 * 29 in its head (its base
eval is near 0, docs/agents.md), but it can copy the two numbers into a call and the tool's
result into its answer.
"""

from __future__ import annotations

import ast
import operator
import random
import re

from envrl.envs import Rubric, Task, ToolEnvironment

MAX_EXPRESSION = 200
"""Characters of an expression the tool evaluates; longer is an error reply (model-written input)."""
MAX_DIGITS = 60
"""Digits of any intermediate result; beyond is an error reply (bounds the work a call costs)."""
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class ProductTask(Task):
    prompt: str
    a: int
    b: int


class Calculator:
    """The tools the model sees."""

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression of integers with +, -, * and parentheses.

        Args:
            expression: the arithmetic to evaluate, written out in full.
        """
        if len(expression) > MAX_EXPRESSION:
            raise ValueError(f"the expression is {len(expression)} characters; at most {MAX_EXPRESSION}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError:
            raise ValueError(f"not an arithmetic expression: {expression!r}") from None
        return str(_value(tree.body))


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        result = _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
        if len(str(abs(result))) > MAX_DIGITS:
            raise ValueError(f"a result has more than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"only integers, +, -, * and parentheses are supported, not {ast.dump(node)[:60]}")


def last_integer(text: str) -> int | None:
    """The last integer written in `text` (digit groups with commas joined), None if there is none."""
    found = re.findall(r"-?\d[\d,]*", text)
    return int(found[-1].replace(",", "")) if found else None


def correct(completion: str, a: int, b: int) -> float:
    """1.0 when the last integer of the final answer is a * b, else 0.0."""
    return 1.0 if last_integer(completion) == a * b else 0.0


def make_tasks(count: int, seed: int) -> list[ProductTask]:
    """ "What is a * b?" with a in 100..999 and b in 10..99."""
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        tasks.append(ProductTask(idx=i, prompt=f"What is {a} * {b}?", a=a, b=b))
    return tasks


def load_environment(num_train: int = 1000, num_eval: int = 64, seed: int = 0, max_turns: int = 3) -> ToolEnvironment:
    return ToolEnvironment(
        tool_class=Calculator,
        tasks=lambda: make_tasks(num_train, seed),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1),
        rubric=Rubric({correct: 1.0}),
        max_turns=max_turns,
    )
