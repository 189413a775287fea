"""The tree's layers: the shared libraries never import a process package above them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "envrl"

# Each shared layer may import only the layers listed before it (and itself).
LAYERS = ["config_migrations", "config_schema", "config", "runtime", "data", "telemetry", "model"]
PROCESS_PACKAGES = {"launcher", "trainer", "inference", "serve", "orchestrator", "eval", "report"}


def envrl_imports(path: Path) -> set[str]:
    """The top-level envrl packages or modules a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("envrl."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("envrl.")}
    return found


def test_shared_layers_import_only_the_layers_below_them() -> None:
    violations = []
    for depth, layer in enumerate(LAYERS):
        allowed = set(LAYERS[: depth + 1])
        files = [SRC / f"{layer}.py"] if (SRC / f"{layer}.py").exists() else sorted((SRC / layer).rglob("*.py"))
        for path in files:
            wrong = envrl_imports(path) - allowed
            violations += [f"{path.relative_to(SRC)} imports envrl.{name}" for name in sorted(wrong)]
    assert not violations, "a shared layer reaches up:\n" + "\n".join(violations)


def test_every_top_level_package_is_a_layer_or_a_process_or_a_library_of_envs() -> None:
    """A new top-level package must be placed in the layering above (or here) on purpose."""
    others = {"envs", "envclient", "proxy", "sandbox", "transport"}
    names = {p.stem for p in SRC.iterdir() if p.suffix == ".py" and p.stem != "__init__"}
    names |= {p.name for p in SRC.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert names == set(LAYERS) | PROCESS_PACKAGES | others


def test_nothing_imports_the_launcher() -> None:
    """The launcher (`rl`) is the top: it supervises every process, and none reaches back up into it."""
    importers = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] != "launcher" and "launcher" in envrl_imports(path)
    ]
    assert not importers, "these modules import envrl.launcher (move what they need below it):\n" + "\n".join(importers)


def test_the_env_client_library_imports_none_of_its_users() -> None:
    """`envclient/` (env configs, servers, handles, the eval grid) serves the orchestrator and `rl eval`; it imports neither."""
    users = {"orchestrator", "eval", "report", "launcher"}
    wrong = [
        f"{path.relative_to(SRC)} imports envrl.{name}"
        for path in sorted((SRC / "envclient").rglob("*.py"))
        for name in sorted(envrl_imports(path) & users)
    ]
    assert not wrong, "envclient reaches up into a package that uses it:\n" + "\n".join(wrong)


def test_the_launcher_reads_the_servers_and_the_orchestrator_only_through_their_config_and_launch() -> None:
    """`rl` plans the orchestrator, the inference servers and the env servers from their `config` modules and
    starts the servers through their `launch` modules; it reaches no internal, so each can change inside
    without `rl` changing."""
    packages = ("envrl.orchestrator.", "envrl.inference.", "envrl.serve.", "envrl.eval.")
    wrong = [
        f"{path.relative_to(SRC)} imports {node.module}"
        for path in sorted((SRC / "launcher").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(packages)
        and (node.module or "").rsplit(".", 1)[1] not in ("config", "launch")
    ]
    assert not wrong, "the launcher imports process internals:\n" + "\n".join(wrong)
