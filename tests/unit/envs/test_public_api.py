"""The env-author API does not move under an env: every import the docs show resolves where they
show it, every module path public in 0.1 still imports (as the module at its new path, with a
DeprecationWarning naming it), and an env written against 0.1's documented imports loads and
scores unchanged."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

import envrl
import envrl.envs
from envrl import MOVED

ROOT = Path(__file__).resolve().parents[3]
DOCS = [
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    *sorted((ROOT / "deps" / "envs").glob("*/README.md")),
]
HISTORY = ROOT / "docs" / "CHANGELOG.md"
"""Names old paths on purpose; every other doc shows only current ones."""

NOT_MODULES = {"envrl.environments"}
"""Dotted names in the docs that are not Python paths (the entry-point group of env packages)."""

DOCUMENTED_IN_0_1 = {
    "envrl.traces": ["Message", "Task", "Trace"],
    "envrl.seeds": ["call_seed", "eval_seed"],
    "envrl.samples": ["BatchError", "batch_dir", "read_batch", "write_batch"],
    "envrl.http": ["keep_alive_session", "request_json"],
    "envrl.process": ["spawn", "spawn_sidecar"],
    "envrl.lifeline": ["die_with_parent"],
    "envrl.envs.tool_calls": ["parse"],
    "envrl.orchestrator.evaluate": ["main"],
    "envrl.envs": [
        *("ClientConfig", "Environment", "EnvironmentNotFound", "EvalClientConfig", "ModelClient", "ModelResponse"),
        *("RolloutState", "Rubric", "SamplingArgs", "ScriptedClient", "ScriptedClientConfig", "Split", "TaskSource"),
        *("ToolEnvironment", "TrainClientConfig", "build_client", "installed_environment_ids", "load_environment"),
    ],
    "envrl.sandbox": ["BubblewrapProvider", "Sandbox", "SandboxConfig", "SandboxProvider", "WarmPool"],
    "envrl.sandbox.venv": ["sandbox_venv"],
}
"""What 0.1's docs and example envs imported (`git show a807e21:docs/` and `:deps/envs/`), by path."""

ENV_AUTHOR_NAMES = {"Environment", "ToolEnvironment", "Rubric", "Task", "Trace", "Message", "RolloutState"}
ENV_AUTHOR_NAMES |= {"ModelClient", "SamplingArgs", "ScriptedClient", "build_client", "load_environment"}
ENV_AUTHOR_NAMES |= {"Sandbox", "SandboxConfig", "SandboxProvider", "BubblewrapProvider", "WarmPool"}


def doc_imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) for every `from envrl... import name` the docs show."""
    found = []
    for doc in DOCS:
        for module, names in re.findall(r"from (envrl[\w.]*) import (\([^)]*\)|[^\n]*)", doc.read_text()):
            for name in re.sub(r"#[^\n]*", "", names).strip("()").split(","):
                if name.strip():
                    found.append((doc.name, module, name.split(" as ")[0].strip()))
    return found


def doc_references() -> list[tuple[str, str]]:
    """(doc, dotted path) for every `envrl.x.y` the docs name."""
    return [
        (doc.name, ref)
        for doc in DOCS
        for ref in sorted(set(re.findall(r"\benvrl(?:\.[A-Za-z_]\w*)+", doc.read_text())))
        if ref not in NOT_MODULES
    ]


def is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:  # a parent is a module, not a package
        return False


def module_defines(module: str, name: str) -> bool:
    """`module`'s source binds `name` at its top level (read, not imported: some pull in vLLM)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, ast.Import | ast.ImportFrom) and name in {a.asname or a.name for a in node.names}:
            return True
    return is_module(f"{module}.{name}")


def test_the_env_author_api_is_envrl_envs() -> None:
    assert set(envrl.envs.__all__) >= ENV_AUTHOR_NAMES
    assert all(getattr(envrl.envs, name) is not None for name in envrl.envs.__all__)
    shown = {name for doc, module, name in doc_imports() if (doc, module) == ("environments.md", "envrl.envs")}
    assert set(envrl.envs.__all__) <= shown  # docs/environments.md, The public API, lists all of it


def test_the_docs_show_imports_that_resolve_where_they_show_them() -> None:
    imports = doc_imports()
    assert {"Task", "Environment", "load_environment"} <= {name for _, _, name in imports}  # the scan found them
    wrong = []
    for doc, module, name in imports:
        if doc != HISTORY.name and module in MOVED:
            wrong.append(f"{doc}: from {module} (moved to {MOVED[module].new})")
        elif not hasattr(importlib.import_module(module), name):
            wrong.append(f"{doc}: from {module} import {name}")
    assert not wrong


def test_the_docs_name_only_paths_that_exist() -> None:
    references = doc_references()
    assert len(references) > 20  # the scan found them
    wrong = []
    for doc, ref in references:
        parts = ref.split(".")
        modules = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        module = next(m for m in modules if m in MOVED or is_module(m))
        rest = parts[len(module.split(".")) :]
        if doc != HISTORY.name and module in MOVED:
            wrong.append(f"{doc}: {ref} (moved to {MOVED[module].new})")
        elif rest and module not in MOVED and not module_defines(module, rest[0]):
            wrong.append(f"{doc}: {ref} ({module} has no {rest[0]})")
    assert not wrong


@pytest.fixture
def unimported() -> Iterator[None]:
    """The old paths forgotten, before and after, so each test sees a first import (and its warning)."""
    for old in MOVED:
        sys.modules.pop(old, None)
    try:
        yield
    finally:
        for old in MOVED:
            sys.modules.pop(old, None)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_path_public_in_0_1_imports_its_new_module_with_a_warning(old: str, unimported: None) -> None:
    new = MOVED[old].new
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} moved to {re.escape(new)} .* goes in 0\.3"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("path", sorted(DOCUMENTED_IN_0_1))
def test_every_name_0_1_documented_imports_from_its_0_1_path(path: str, unimported: None) -> None:
    with pytest.warns(DeprecationWarning) if path in MOVED else nullcontext():
        module = importlib.import_module(path)
    assert [name for name in DOCUMENTED_IN_0_1[path] if not hasattr(module, name)] == []


def test_no_old_path_is_a_module_of_the_tree_too() -> None:
    """An old path answers only while nothing else is there (a stale row would hide a real module)."""
    clashes = []
    for old in MOVED:
        parent, _, leaf = old.rpartition(".")
        if PathFinder.find_spec(leaf, importlib.import_module(parent).__path__) is not None:
            clashes.append(old)
    assert clashes == []


LOAD_0_1_ENV = """
import asyncio
from envrl.envs import SamplingArgs, ScriptedClient, ScriptedClientConfig, load_environment
env = load_environment("tests.support.env_0_1:load_environment", num_train=4, num_eval=2)
task = env.get_task("train", 0)
trace = asyncio.run(env.run_rollout(task, ScriptedClient(ScriptedClientConfig(replies=[task.target])), SamplingArgs()))
print(trace.reward)
"""


def test_an_env_written_against_0_1_loads_and_scores_unchanged_with_warnings() -> None:
    """A fresh interpreter, as an env server's worker is: the first import of each old path warns."""
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", LOAD_0_1_ENV],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"  # the exact reversal: LCS ratio 1
    assert "envrl.traces moved to envrl.data.traces" in done.stderr and "env_0_1.py" in done.stderr
