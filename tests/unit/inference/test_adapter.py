"""`/update_weights` with LoRA adapters, against a recording stand-in for vLLM's engine: the
adapter is routed under the served names, full weights drop it, bad adapters are refused before
the engine is touched, a failed load leaves the previous adapter serving."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from envrl.config import ConfigError
from envrl.inference.adapter import ADAPTER_ID, check_lora_support
from envrl.inference.config import lora_serving_options
from envrl.inference.reload import WeightReloadPlugin


class FakeEngine:
    """Records what the plugin asks of vLLM; `fail_add` makes the next add_lora raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_add = False

    async def pause_generation(self, **_: Any) -> None:
        self.calls.append(("pause", None))

    async def resume_generation(self) -> None:
        self.calls.append(("resume", None))

    async def update_weight_version(self, version: str) -> None:
        """vLLM's label of the tokens generated from now on (not what these tests check)."""

    async def add_lora(self, request: Any) -> bool:
        if self.fail_add:
            raise ValueError("bad adapter weights")
        self.calls.append(("add_lora", (request.lora_int_id, request.lora_path, request.load_inplace)))
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove_lora", lora_id))
        return True

    async def collective_rpc(self, method: str, args: tuple[Any, ...]) -> None:
        self.calls.append((method, args[0]))


def adapter_dir(path: Path, rank: int) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": ["q_proj"]}))
    return path


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, FakeEngine, Any, Path]:
    base = tmp_path / "base"
    base.mkdir()
    save_file({"w": torch.zeros(2, 2)}, base / "model.safetensors")
    engine = FakeEngine()
    models = SimpleNamespace(lora_requests={}, base_model_paths=[SimpleNamespace(name="policy")])
    plugin = WeightReloadPlugin()
    args = Namespace(
        model=str(base), enable_lora=True, max_lora_rank=8, tensor_parallel_size=1, pipeline_parallel_size=1
    )
    asyncio.run(plugin.init_state(engine, SimpleNamespace(openai_serving_models=models), args))
    app = FastAPI()
    plugin.attach_router(app)
    return TestClient(app), engine, models, base


def test_an_adapter_is_hot_loaded_in_place_and_routed_under_the_served_name(served, tmp_path: Path) -> None:
    client, engine, models, base = served
    for step in (1, 2):
        path = adapter_dir(tmp_path / f"step_{step}", rank=8)
        assert client.post("/update_weights", json={"path": str(path), "step": step}).status_code == 200
        assert engine.calls[-3:] == [("pause", None), ("add_lora", (ADAPTER_ID, str(path), True)), ("resume", None)]
        routed = models.lora_requests["policy"]
        assert (routed.lora_int_id, routed.lora_path, routed.load_inplace) == (ADAPTER_ID, str(path), False)
    assert client.get("/weights").json() == {"path": str(path), "step": 2}
    assert client.post("/update_weights", json={"path": str(base), "step": 3}).status_code == 200
    assert ("remove_lora", ADAPTER_ID) in engine.calls and models.lora_requests == {}  # full weights alone


def test_bad_adapters_are_refused_and_a_failed_load_keeps_the_previous_one(served, tmp_path: Path) -> None:
    client, engine, models, _ = served
    good = adapter_dir(tmp_path / "good", rank=8)
    assert client.post("/update_weights", json={"path": str(good)}).status_code == 200
    calls = len(engine.calls)
    too_big = client.post("/update_weights", json={"path": str(adapter_dir(tmp_path / "big", rank=16))})
    assert too_big.status_code == 400 and "max_lora_rank 8" in too_big.json()["error"]
    assert len(engine.calls) == calls  # refused before the engine was touched
    engine.fail_add = True
    failed = client.post("/update_weights", json={"path": str(adapter_dir(tmp_path / "broken", rank=8))})
    assert failed.status_code == 400 and f"previous policy from {good} keeps serving" in failed.json()["error"]
    assert models.lora_requests["policy"].lora_path == str(good)
    assert engine.calls[-1] == ("resume", None)


def test_a_server_without_lora_refuses_an_adapter_naming_the_option(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    save_file({"w": torch.zeros(2, 2)}, base / "model.safetensors")
    plugin = WeightReloadPlugin()
    asyncio.run(
        plugin.init_state(None, None, Namespace(model=str(base), tensor_parallel_size=1, pipeline_parallel_size=1))
    )
    app = FastAPI()
    plugin.attach_router(app)
    refused = TestClient(app).post("/update_weights", json={"path": str(adapter_dir(tmp_path / "a", rank=8))})
    assert refused.status_code == 400 and "inference.vllm.enable_lora = true" in refused.json()["error"]


def test_serving_options_round_the_rank_up_to_one_vllm_takes() -> None:
    assert lora_serving_options(4) == {"enable_lora": True, "max_lora_rank": 8}
    assert lora_serving_options(16)["max_lora_rank"] == 16
    assert lora_serving_options(33)["max_lora_rank"] == 64


def test_lora_for_a_model_vllm_cannot_adapt_is_a_one_line_config_error() -> None:
    check_lora_support(["LlamaForCausalLM"], "llama")
    with pytest.raises(ConfigError, match="vLLM cannot serve LoRA adapters for m .architecture BloomForCausalLM"):
        check_lora_support(["BloomForCausalLM"], "m")


def test_rl_starts_vllm_with_lora_when_the_trainer_trains_lora_and_inference_vllm_wins() -> None:
    from envrl.config import resolve_config
    from envrl.launcher.config import RLConfig
    from envrl.launcher.plan.run import plan

    envs = ("orchestrator.envs", '[{"id": "reverse-text"}]')
    assert "enable_lora" not in plan(resolve_config(RLConfig, overrides=[envs])).inference.vllm
    lora = plan(resolve_config(RLConfig, overrides=[envs, ("trainer.lora.rank", "12")]))
    assert lora.inference.vllm == {"enable_lora": True, "max_lora_rank": 16}
    mine = ("inference.vllm", '{"max_lora_rank": 64}')
    assert plan(resolve_config(RLConfig, overrides=[envs, ("trainer.lora.rank", "12"), mine])).inference.vllm == {
        "enable_lora": True,
        "max_lora_rank": 64,
    }
