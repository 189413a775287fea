"""ParamsChecker and ModelAccessConfig: the rules a request meets once, at the server's socket."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from envrl.envclient.config import DeclaredEnvConfig
from envrl.inference.config import InferenceConfig, ReloadConfig
from envrl.launcher.config import RLConfig
from envrl.launcher.plan import plan
from envrl.model.client import EvalClientConfig, ScriptedClientConfig, TrainClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.serve import protocol as p
from envrl.serve.config import ModelAccessConfig
from envrl.serve.params import ParamsChecker

SCRIPTED = {"type": "scripted", "replies": ["a"]}
SAMPLING = {"max_tokens": 4}
URL = "http://127.0.0.1:8000"


def checker(**access: Any) -> ParamsChecker:
    return ParamsChecker({"train": 3, "eval": 1}, max_group_size=8, model_access=ModelAccessConfig(**access))


def refusal(check: ParamsChecker, method: str, params: Any) -> str:
    with pytest.raises(p.ProtocolError) as raised:
        getattr(check, method)(params, "r1")
    assert (raised.value.type, raised.value.request_id) == (p.BAD_REQUEST, "r1")
    return raised.value.message


def test_valid_params_come_back_typed_with_the_group_size() -> None:
    group = checker().run({"task_idx": 2, "n": 8, "model": "m", "sampling": SAMPLING, "seed": 5}, "r")
    assert (group.task_idx, group.n, group.seed, group.model, group.sampling.max_tokens) == (2, 8, 5, "m", 4)
    assert checker().run({"task_idx": 0, "model": "m", "sampling": SAMPLING}, "r").n == 1
    assert isinstance(checker().bind({"client": SCRIPTED}, "r"), ScriptedClientConfig)


@pytest.mark.parametrize(
    ("field", "value"),
    [("task_idx", [1]), ("task_idx", 1.5), ("task_idx", True), ("task_idx", 3), ("task_idx", 2**64 - 1), ("task_idx", -1),
     ("split", [1]), ("split", {"a": 1}), ("split", "test"), ("seed", "1"), ("seed", math.nan), ("n", 0), ("n", 9),
     ("n", 2**63), ("n", "2"), ("model", 1), ("model", None), ("sampling", {"max_tokens": [4]}), ("bogus", 1)],
)  # fmt: skip
def test_every_wrong_run_field_is_refused_naming_it(field: str, value: Any) -> None:
    good = {"task_idx": 0, "n": 2, "model": "m", "sampling": SAMPLING}
    message = refusal(checker(), "run", {**good, field: value})
    assert f"params.{field}" in message, message


@pytest.mark.parametrize("client", [[SCRIPTED], {"type": "scripted", "replies": "a"}, {"type": "nope"}, None])
def test_a_malformed_client_is_refused_at_bind(client: Any) -> None:
    assert "params.client" in refusal(checker(), "bind", {"client": client})


def test_a_task_index_out_of_range_names_the_split_and_its_range() -> None:
    assert "0..0 for split 'eval', got 1" in refusal(
        checker(), "run", {"task_idx": 1, "split": "eval", "model": "m", "sampling": SAMPLING}
    )


def test_cancel_params_are_checked_by_their_model() -> None:
    assert checker().cancel({"request_id": "x"}, "r").request_id == "x"
    with pytest.raises(p.ProtocolError) as raised:
        checker().cancel({"request_id": ["x"]}, "r")
    assert "params.request_id" in raised.value.message


def test_by_default_only_scripted_clients_without_a_tokenizer_pass() -> None:
    access = ModelAccessConfig()
    assert access.problem(ScriptedClientConfig()) is None
    assert "model_access.base_urls" in (access.problem(EvalClientConfig(base_url=URL, model="m")) or "")
    assert "params.client.tokenizer" in (access.problem(ScriptedClientConfig(tokenizer="deps/models/tiny-chat")) or "")


def test_allowed_urls_keys_and_tokenizers_pass_and_others_name_their_field() -> None:
    access = ModelAccessConfig(base_urls=[URL + "/"], api_key_envs=["KEY"], tokenizers=["deps/models"])
    assert access.problem(EvalClientConfig(base_url=URL, model="m", api_key_env="KEY")) is None
    assert access.problem(TrainClientConfig(base_url=URL, model="deps/models/tiny-chat")) is None
    assert (
        access.problem(
            TrainClientConfig(base_url=URL, model="m", tokenizer=str(Path("deps/models/tiny-chat").resolve()))
        )
        is None
    )
    assert "api_key_env 'HOME'" in (access.problem(EvalClientConfig(base_url=URL, model="m", api_key_env="HOME")) or "")
    assert "params.client.model 'gpt2'" in (access.problem(TrainClientConfig(base_url=URL, model="gpt2")) or "")
    assert "params.client.tokenizer '/etc'" in (access.problem(ScriptedClientConfig(tokenizer="/etc")) or "")
    assert "deps/models/../../etc" in (access.problem(ScriptedClientConfig(tokenizer="deps/models/../../etc")) or "")


@pytest.mark.parametrize("tokenizer", ["t" * 5000, "a/" * 3000, "nul\x00byte"])
def test_a_tokenizer_no_file_system_could_hold_is_a_bad_request_shown_cut(tokenizer: str) -> None:
    """Before: `Path.exists` raised ENAMETOOLONG in the broker: internal_error and a traceback per request."""
    message = refusal(
        checker(tokenizers=["deps/models"]), "bind", {"client": {"type": "scripted", "tokenizer": tokenizer}}
    )
    assert "params.client.tokenizer" in message and "is not allowed by this server" in message
    assert len(message) < 600


def test_a_server_spawned_for_a_client_allows_exactly_that_client() -> None:
    client = EvalClientConfig(base_url=URL + "/v1", model="m", api_key_env="KEY")
    access = ModelAccessConfig.for_client(client)
    assert access.problem(client) is None
    assert access.problem(client.model_copy(update={"api_key_env": "OTHER"})) is not None
    assert access.problem(client.model_copy(update={"base_url": "http://203.0.113.9/v1"})) is not None


def test_the_launchers_env_servers_allow_the_runs_inference_server_and_model() -> None:
    orchestrator = OrchestratorConfig(envs=[DeclaredEnvConfig(id="reverse-text")])
    run = plan(RLConfig(orchestrator=orchestrator))
    model = run.orchestrator.model.name
    # The client the orchestrator sends (orchestrator/loop.py `_make_env`): the tokenizer is the resolved model path.
    client = TrainClientConfig(
        base_url=run.orchestrator.inference.base_url, model=model, tokenizer=str(Path(model).resolve())
    )
    (server,) = run.env_servers
    assert server.config.model_access.problem(client) is None


def test_the_launchers_env_server_for_an_env_with_its_own_client_allows_that_client() -> None:
    teacher = EvalClientConfig(base_url="https://api.example.com/v1", model="teacher", api_key_env="TEACHER_KEY")
    orchestrator = OrchestratorConfig(
        envs=[DeclaredEnvConfig(id="reverse-text"), DeclaredEnvConfig(id="reverse-text", name="taught", client=teacher)]
    )
    plain, taught = plan(RLConfig(orchestrator=orchestrator)).env_servers
    assert taught.config.model_access.problem(teacher) is None
    assert plain.config.model_access.problem(teacher) is not None


def test_the_orchestrator_reads_the_reload_token_from_the_variable_the_inference_server_uses() -> None:
    inference = InferenceConfig(reload=ReloadConfig(token_env="MY_RELOAD_TOKEN"))
    run = plan(
        RLConfig(orchestrator=OrchestratorConfig(envs=[DeclaredEnvConfig(id="reverse-text")]), inference=inference)
    )
    assert run.orchestrator.inference.reload_token_env == "MY_RELOAD_TOKEN"
