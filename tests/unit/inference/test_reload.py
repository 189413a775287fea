"""`/update_weights` is guarded off loopback: config refuses an open bind, the route demands the token."""

import asyncio
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from envrl.config import ConfigError, resolve_config
from envrl.inference.config import InferenceConfig, ReloadConfig
from envrl.inference.reload import MAX_BODY, RELOAD_ENV, WeightReloadPlugin


def test_a_non_loopback_host_needs_the_explicit_opt_in_and_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVRL_RELOAD_TOKEN", raising=False)
    assert resolve_config(InferenceConfig, overrides=[("host", "127.0.0.1")]).host == "127.0.0.1"
    with pytest.raises(ConfigError, match="set inference.reload.allow_remote = true"):
        resolve_config(InferenceConfig, overrides=[("host", "0.0.0.0")])
    with pytest.raises(ConfigError, match="needs a token; set the environment variable ENVRL_RELOAD_TOKEN"):
        resolve_config(InferenceConfig, overrides=[("host", "0.0.0.0"), ("reload.allow_remote", "true")])
    monkeypatch.setenv("ENVRL_RELOAD_TOKEN", "s3cret")
    assert resolve_config(
        InferenceConfig, overrides=[("host", "0.0.0.0"), ("reload.allow-remote", "true")]
    ).reload.allow_remote


def test_with_a_token_set_the_route_refuses_callers_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    served.mkdir()
    save_file({"w": torch.zeros(2, 2)}, served / "model.safetensors")
    monkeypatch.setenv(RELOAD_ENV, ReloadConfig(token_env="TEST_RELOAD_TOKEN").model_dump_json())
    monkeypatch.setenv("TEST_RELOAD_TOKEN", "s3cret")
    plugin = WeightReloadPlugin()
    asyncio.run(
        plugin.init_state(None, None, Namespace(model=str(served), tensor_parallel_size=1, pipeline_parallel_size=1))
    )  # no engine: refusals never reach it
    app = FastAPI()
    plugin.attach_router(app)
    client = TestClient(app)
    body = {"path": str(tmp_path / "step_1"), "step": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = client.post("/update_weights", json=body, headers=headers)
        assert refused.status_code == 401 and "TEST_RELOAD_TOKEN" in refused.json()["error"]
    # the token is checked before the body is read: no schema for a malformed or huge body without it
    for content in (b"{not json", b"x" * (4 * MAX_BODY)):
        refused = client.post("/update_weights", content=content)
        assert refused.status_code == 401 and "path" not in refused.text
    granted = {"Authorization": "Bearer s3cret"}
    assert client.post("/update_weights", content=b"x" * (MAX_BODY + 1), headers=granted).status_code == 413
    invalid = client.post("/update_weights", content=b'{"step": -1}', headers=granted)
    assert invalid.status_code == 422 and "path" in invalid.json()["error"]
    checked = client.post("/update_weights", json=body, headers=granted)
    assert checked.status_code == 400 and "does not exist" in checked.json()["error"]
