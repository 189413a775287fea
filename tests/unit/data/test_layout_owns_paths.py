"""Every path under a run's `output_dir` is named in `envrl/data/layout.py`, and built nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "envrl"
LAYOUT = Path("data/layout.py")

RUN_DIR_NAMES = {"output_dir"}
"""Names (variables, attributes, parameters) that hold a run's output dir in envrl."""

ALLOWED: dict[Path, int] = {}
"""Files that may still build run paths themselves, with how many they build (none: layout.py names them all)."""


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def layout_functions(src: Path) -> set[str]:
    """The path functions `layout.py` defines (the ones that take the run dir first)."""
    tree = ast.parse((src / LAYOUT).read_text())
    return {
        f.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and f.args.args and f.args.args[0].arg in RUN_DIR_NAMES
    }


def builds_run_path(node: ast.AST, layout_names: set[str]) -> bool:
    """`node` is `<run dir> / "literal"`: the left side names the run dir (`output_dir`,
    `config.output_dir`, `Path(output_dir)`) or is a layout call (`logs_dir(out)`), the right is a string."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
        return False
    if not isinstance(node.right, ast.Constant | ast.JoinedStr) or (
        isinstance(node.right, ast.Constant) and not isinstance(node.right.value, str)
    ):
        return False
    left = node.left
    if _name(left) in RUN_DIR_NAMES:
        return True
    if isinstance(left, ast.Call):
        called = _name(left.func)
        if called in layout_names:
            return True
        return called == "Path" and any(_name(a) in RUN_DIR_NAMES for a in left.args)
    return False


def run_path_builds(src: Path) -> dict[Path, list[int]]:
    """Per module under `src` (but `layout.py`), the lines that build a run path themselves."""
    layout_names = layout_functions(src)
    found: dict[Path, list[int]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel == LAYOUT:
            continue
        lines = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if builds_run_path(n, layout_names)]
        if lines:
            found[rel] = sorted(lines)
    return found


def test_only_layout_builds_paths_under_the_run_dir() -> None:
    found = run_path_builds(SRC)
    wrong = {rel: lines for rel, lines in found.items() if len(lines) != ALLOWED.get(rel, 0)}
    assert not wrong, (
        "a path under output_dir is built outside envrl/data/layout.py; name it there (a function with a "
        "one-line docstring giving the path) and call it:\n"
        + "\n".join(f"  src/envrl/{rel}:{','.join(map(str, lines))}" for rel, lines in wrong.items())
    )


def test_the_check_sees_each_form_of_a_run_path() -> None:
    names = {"logs_dir"}
    forms = ['output_dir / "x"', 'config.output_dir / f"{a}.toml"', 'Path(output_dir) / "x"', 'logs_dir(out) / "x"']
    for form in forms:
        assert builds_run_path(ast.parse(form, mode="eval").body, names), form
    for form in ['model_dir / "x"', "output_dir / name", 'Path(model) / "x"', "output_dir / 2"]:
        assert not builds_run_path(ast.parse(form, mode="eval").body, names), form
