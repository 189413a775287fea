"""Which ASGI app an OpenEnv `app` spec names: a module attribute, or what a factory builds."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envrl.envs.adapters.openenv import load_app

SERVER = """
app = "the module's app"
calls = []


def create_app():
    calls.append(1)
    return f"built app {len(calls)}"
"""


@pytest.fixture
def server_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "fake_openenv_server.py").write_text(SERVER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_openenv_server"
    sys.modules.pop("fake_openenv_server", None)


def test_an_attribute_names_the_app_and_a_module_alone_means_its_app(server_module: str) -> None:
    assert load_app(f"{server_module}:app") == load_app(server_module) == "the module's app"


def test_a_factory_spec_builds_the_app_by_calling_it(server_module: str) -> None:
    assert load_app(f"{server_module}:create_app()") == "built app 1"


def test_a_missing_attribute_names_the_spec_and_the_module(server_module: str) -> None:
    with pytest.raises(
        ValueError, match=r"'fake_openenv_server:make\(\)': module 'fake_openenv_server' has no attribute 'make'"
    ):
        load_app(f"{server_module}:make()")
