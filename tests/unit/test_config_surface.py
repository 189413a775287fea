"""The keys users write: every renamed key points at a key that exists, and the old name is
refused with a one-line did-you-mean naming the new one, wherever it was given."""

import re
import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from envrl.config import ConfigError, resolve_config
from envrl.config_schema import types_at_path, unwrap_types
from envrl.eval.main import EvalCommandConfig
from envrl.launcher.config import RLConfig, resolve_run
from envrl.serve.config import EnvServerConfig
from envrl.trainer.sft import SFTConfig

ENTRY_POINTS: list[type[BaseModel]] = [RLConfig, EvalCommandConfig, EnvServerConfig, SFTConfig]
ONE_ENV = {"orchestrator": {"envs": [{"id": "reverse-text"}]}}


def models_in(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """`model` and every model reachable through its fields (list items and union members too)."""
    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():
        for tp in unwrap_types(field.annotation):
            inner = unwrap_types(typing.get_args(tp)[0]) if typing.get_origin(tp) is list else [tp]
            for sub in inner:
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    models_in(sub, seen)
    return seen


RENAMED = sorted(
    {
        (model.__name__, old, new)
        for entry in ENTRY_POINTS
        for model in models_in(entry, set())
        for old, new in getattr(model, "renamed_keys", {}).items()
    }
)


REMOVED = sorted(
    {
        (model.__name__, old)
        for entry in ENTRY_POINTS
        for model in models_in(entry, set())
        for old in getattr(model, "removed_keys", {})
    }
)


@pytest.mark.parametrize(("model_name", "old"), REMOVED)
def test_a_removed_key_is_no_key(model_name: str, old: str) -> None:
    model = next(m for entry in ENTRY_POINTS for m in models_in(entry, set()) if m.__name__ == model_name)
    assert old not in model.model_fields, f"{model_name}.{old} is still a key"


@pytest.mark.parametrize(("model_name", "old", "new"), RENAMED)
def test_a_renamed_key_names_a_key_that_exists_and_is_not_one_itself(model_name: str, old: str, new: str) -> None:
    model = next(m for entry in ENTRY_POINTS for m in models_in(entry, set()) if m.__name__ == model_name)
    assert old not in model.model_fields, f"{model_name}.{old} is still a key"
    assert types_at_path(model, new.split(".")), f"{model_name}: {old} -> {new}, which is no key"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [("trainer.max-tokens", "512")],
            "unknown config key 'trainer.max_tokens' (from --trainer.max-tokens on the command line); "
            "did you mean 'trainer.micro_batch_tokens'? (the key was renamed)",
        ),
        ([("shutdown-grace", "5")], "did you mean 'shutdown_grace_s'?"),
        (
            [("restarts.trainer.max-restarts", "0")],
            "'restarts.trainer' (from --restarts.trainer.max-restarts on the "
            "command line); it was removed: one policy for every process rl starts",
        ),
        (
            [("trainer.batch-poll-s", "1")],
            "unknown config key 'trainer.batch_poll_s' (from --trainer.batch-poll-s on the command line); it was "
            "removed: the trainer polls every 20 ms (envrl.transport.batches.POLL_S)",
        ),
        ([("orchestrator.eval-envs", "[]")], "did you mean 'orchestrator.eval.env'? (the key was renamed)"),
        ([("orchestrator.weights-timeout", "5")], "did you mean 'orchestrator.weights_timeout_s'?"),
        ([("orchestrator.inference.retry.timeout", "5")], "did you mean 'orchestrator.inference.retry.timeout_s'?"),
        (
            [("orchestrator.envs", '[{"id": "reverse-text", "timeout": {"rollout": 5}}]')],
            "did you mean 'orchestrator.envs[0].timeout.rollout_s'?",
        ),
    ],
)
def test_an_old_key_on_the_command_line_is_refused_naming_its_new_key(
    overrides: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_config(RLConfig, overrides=overrides, base=ONE_ENV)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_minimal_config_of_the_docs_resolves_into_a_run() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    minimal = re.search(r"## Minimal config.*?```toml\n(.*?)```", docs, re.S)
    assert minimal, "docs/config.md has no TOML block under '## Minimal config'"
    run = resolve_run(RLConfig.model_validate(tomllib.loads(minimal.group(1))))
    assert [server.name for server in run.env_servers] == ["reverse-text"]
    assert run.orchestrator.max_inflight == 64  # derived: batch_size 32 * (max_async_level 1 + 1)
