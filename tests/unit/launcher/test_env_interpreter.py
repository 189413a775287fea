"""An env's `python` / `project` picks the interpreter its spawned server runs in; a missing one is a clear error."""

import json
import sys
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan


def run_with_env(env: dict[str, str]) -> RLConfig:
    return resolve_config(RLConfig, overrides=[("orchestrator.envs", json.dumps([{"id": "reverse-text", **env}]))])


def test_env_servers_run_in_the_launchers_interpreter_by_default() -> None:
    (server,) = plan(run_with_env({})).env_servers
    assert server.python == sys.executable


def test_project_resolves_to_its_venv_python(tmp_path: Path) -> None:
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (server,) = plan(run_with_env({"project": str(tmp_path)})).env_servers
    assert server.python == str(python)


def test_a_project_without_its_venv_says_the_command_that_creates_it(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=f"create it with `uv sync --project {tmp_path} --locked`"):
        plan(run_with_env({"project": str(tmp_path)}))


def test_a_missing_python_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(ConfigError, match=f"env 'reverse-text': python {missing} does not exist"):
        plan(run_with_env({"python": str(missing)}))


def test_python_and_project_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set `python` or `project`, not both"):
        run_with_env({"python": sys.executable, "project": str(tmp_path)})
