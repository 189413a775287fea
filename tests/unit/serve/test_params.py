"""ParamsChecker: the rules a request meets once, at the server's socket; and the client the
servers `rl` plans serve (their config, protocol 3)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from envrl.envclient.config import DeclaredEnvConfig
from envrl.inference.config import InferenceConfig, ReloadConfig
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan
from envrl.model.client import EvalClientConfig, TrainClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.serve import protocol as p
from envrl.serve.params import ParamsChecker

SCRIPTED = {"type": "scripted", "replies": ["a"]}
SAMPLING = {"max_tokens": 4}
URL = "http://127.0.0.1:8000"


def checker(has_client: bool = True) -> ParamsChecker:
    return ParamsChecker({"train": 3, "eval": 1}, max_group_size=8, has_client=has_client)


def refusal(check: ParamsChecker, method: str, params: Any) -> str:
    with pytest.raises(p.ProtocolError) as raised:
        getattr(check, method)(params, "r1")
    assert (raised.value.type, raised.value.request_id) == (p.BAD_REQUEST, "r1")
    return raised.value.message


def test_valid_params_come_back_typed_with_the_group_size() -> None:
    group = checker().run({"task_idx": 2, "n": 8, "sampling": SAMPLING, "seed": 5}, "r")
    assert (group.task_idx, group.n, group.seed, group.sampling.max_tokens) == (2, 8, 5, 4)
    assert checker().run({"task_idx": 0, "sampling": SAMPLING}, "r").n == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("task_idx", [1]), ("task_idx", 1.5), ("task_idx", True), ("task_idx", 3), ("task_idx", 2**64 - 1), ("task_idx", -1),
     ("split", [1]), ("split", {"a": 1}), ("split", "test"), ("seed", "1"), ("seed", math.nan), ("n", 0), ("n", 9),
     ("n", 2**63), ("n", "2"), ("model", "m"), ("sampling", {"max_tokens": [4]}), ("bogus", 1)],
)  # fmt: skip
def test_every_wrong_run_field_is_refused_naming_it(field: str, value: Any) -> None:
    good = {"task_idx": 0, "n": 2, "sampling": SAMPLING}
    message = refusal(checker(), "run", {**good, field: value})
    assert f"params.{field}" in message, message


def test_a_server_without_a_client_refuses_every_run_naming_the_option() -> None:
    message = refusal(checker(has_client=False), "run", {"task_idx": 0, "sampling": SAMPLING})
    assert "no model client" in message and "--client" in message


def test_a_task_index_out_of_range_names_the_split_and_its_range() -> None:
    assert "0..0 for split 'eval', got 1" in refusal(
        checker(), "run", {"task_idx": 1, "split": "eval", "sampling": SAMPLING}
    )


def test_cancel_params_are_checked_by_their_model() -> None:
    assert checker().cancel({"request_id": "x"}, "r").request_id == "x"
    with pytest.raises(p.ProtocolError) as raised:
        checker().cancel({"request_id": ["x"]}, "r")
    assert "params.request_id" in raised.value.message


def test_the_launchers_env_servers_serve_the_runs_inference_server_and_model() -> None:
    orchestrator = OrchestratorConfig(envs=[DeclaredEnvConfig(id="reverse-text")])
    run = plan(RLConfig(orchestrator=orchestrator))
    model = run.orchestrator.model.name
    # The client the orchestrator sends (orchestrator/loop.py `_make_env`): the tokenizer is the resolved model path.
    client = TrainClientConfig(
        base_url=run.orchestrator.inference.base_url, model=model, tokenizer=str(Path(model).resolve())
    )
    (server,) = run.env_servers
    assert server.config.client is not None
    assert p.ClientInfo.of(server.config.client) == p.ClientInfo.of(client)


def test_the_launchers_env_server_for_an_env_with_its_own_client_serves_that_client() -> None:
    teacher = EvalClientConfig(base_url="https://api.example.com/v1", model="teacher", api_key_env="TEACHER_KEY")
    orchestrator = OrchestratorConfig(
        envs=[DeclaredEnvConfig(id="reverse-text"), DeclaredEnvConfig(id="reverse-text", name="taught", client=teacher)]
    )
    plain, taught = plan(RLConfig(orchestrator=orchestrator)).env_servers
    assert taught.config.client == EvalClientConfig.of(teacher)
    assert isinstance(plain.config.client, TrainClientConfig)


def test_the_orchestrator_reads_the_reload_token_from_the_variable_the_inference_server_uses() -> None:
    inference = InferenceConfig(reload=ReloadConfig(token_env="MY_RELOAD_TOKEN"))
    run = plan(
        RLConfig(orchestrator=OrchestratorConfig(envs=[DeclaredEnvConfig(id="reverse-text")]), inference=inference)
    )
    assert run.orchestrator.inference.reload_token_env == "MY_RELOAD_TOKEN"
