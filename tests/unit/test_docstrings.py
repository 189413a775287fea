"""Every module in src/ opens with a docstring of at most three lines: its guarantee (the how and the numbers
live in the docs page it names)."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"
MAX_LINES = 3


def docstring_lines(path: Path) -> int | None:
    """Lines the module's leading docstring spans, quotes included; None without one."""
    body = ast.parse(path.read_text(), filename=str(path)).body
    first = body[0] if body else None
    if not (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    ):
        return None
    return (first.end_lineno or first.lineno) - first.lineno + 1


def test_every_module_states_its_guarantee_in_at_most_three_lines() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert modules, f"no modules under {SRC}"
    missing = [str(p.relative_to(SRC)) for p in modules if docstring_lines(p) is None]
    long = {str(p.relative_to(SRC)): n for p in modules if (n := docstring_lines(p) or 0) > MAX_LINES}
    assert not missing, f"modules without a docstring (write its guarantee in 1-{MAX_LINES} lines): {missing}"
    assert not long, (
        f"module docstrings over {MAX_LINES} lines (keep the guarantee; move the how and the numbers to the docs "
        f"page the module names): {long}"
    )
