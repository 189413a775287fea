"""The keys users write: an old name is refused with a one-line did-you-mean naming the new one,
wherever it was given (every row of the migrations table: tests/unit/test_config_migrations.py)."""

import re
import tomllib
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan

ONE_ENV = {"orchestrator": {"envs": [{"id": "reverse-text"}]}}


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
    run = plan(RLConfig.model_validate(tomllib.loads(minimal.group(1))))
    assert [server.name for server in run.env_servers] == ["reverse-text"]
    assert run.orchestrator.max_inflight == 64  # derived: batch_size 32 * (max_async_level 1 + 1)
