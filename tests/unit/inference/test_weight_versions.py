"""A reload pauses as its caller asks and labels the tokens after it with its policy step; vLLM's
`weight_versions` spans become one policy step per generated token, or an error."""

import asyncio
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from envrl.inference.reload import UNLABELLED, WeightReloadPlugin
from envrl.model.inference import InferenceError, token_policy_steps


def test_spans_become_a_policy_step_per_token_and_unlabelled_weights_none() -> None:
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "7", "start": 2, "end": 5}]
    assert token_policy_steps(spans, 5) == [None, None, 7, 7, 7]
    assert token_policy_steps([{"version": UNLABELLED, "start": 0, "end": 1}], 1) == [None]
    assert token_policy_steps(None, 3) is None


def test_spans_that_do_not_cover_the_tokens_are_an_error() -> None:
    with pytest.raises(InferenceError, match="cover 2 tokens, not 3"):
        token_policy_steps([{"version": "1", "start": 0, "end": 2}], 3)
    with pytest.raises(InferenceError, match="do not tile"):
        token_policy_steps([{"version": "1", "start": 1, "end": 3}], 3)


class RecordingEngine:
    """What the reload route asks of vLLM's engine, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def pause_generation(self, **kwargs: Any) -> None:
        self.calls.append(("pause", kwargs))

    async def resume_generation(self) -> None:
        self.calls.append(("resume", None))

    async def collective_rpc(self, method: str, args: tuple[Any, ...]) -> None:
        self.calls.append((method, None))

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("label", version))


@pytest.mark.parametrize(
    ("in_flight", "pause"),
    [("wait", {"mode": "wait", "clear_cache": True}), ("recompute", {"mode": "keep", "clear_cache": True})],
)
def test_a_reload_pauses_as_asked_and_labels_later_tokens_with_its_step(
    tmp_path: Path, in_flight: str, pause: dict[str, Any]
) -> None:
    for name in ("served", "step_4"):
        (tmp_path / name).mkdir()
        save_file({"w": torch.zeros(2, 2)}, tmp_path / name / "model.safetensors")
    engine = RecordingEngine()
    plugin = WeightReloadPlugin()
    args = Namespace(model=str(tmp_path / "served"), tensor_parallel_size=1, pipeline_parallel_size=1)
    asyncio.run(plugin.init_state(engine, None, args))
    app = FastAPI()
    plugin.attach_router(app)
    body = {"path": str(tmp_path / "step_4"), "step": 4, "in_flight": in_flight}
    assert TestClient(app).post("/update_weights", json=body).status_code == 200
    assert engine.calls == [("pause", pause), ("envrl_reload_weights", None), ("label", "4"), ("resume", None)]
