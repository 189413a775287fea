"""The keys users write: within a budget (user keys, `rl --help` lines), declared once, and an old
name is refused with a one-line did-you-mean naming the new one, wherever it was given (every row of
the migrations table: tests/unit/test_config_migrations.py)."""

import re
import tomllib
from pathlib import Path

import pytest

from envrl.config import ConfigError, RunDirKeys, RunKeys, resolve_config
from envrl.config_schema import types_at_path, user_keys
from envrl.inference.config import InferenceConfig
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.plan.run import plan
from envrl.orchestrator.config import OrchestratorConfig
from envrl.serve.config import EnvServerConfig
from envrl.trainer.config import TrainerConfig

ONE_ENV = {"orchestrator": {"envs": [{"id": "reverse-text"}]}}
KEY_BUDGET = 138
"""User keys of `rl` (`scripts/config_keys.py` counts them): no more than after the issue-30 cut."""
HELP_BUDGET = 342
"""Lines of `rl --help` into a pipe of 100 columns: no more than after the issue-30 cut."""


def test_the_config_surface_stays_within_its_budget(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    keys = user_keys(RLConfig)
    assert len(keys) <= KEY_BUDGET, (
        f"rl has {len(keys)} user keys, over its budget of {KEY_BUDGET}: make a key a constant, derive it, or let rl "
        "set it (RLConfig.owned_keys), with a row in config_migrations.MIGRATIONS"
    )
    assert len(lines) <= HELP_BUDGET and max(map(len, lines)) <= 100, f"rl --help: {len(lines)} lines"
    listed = {line.split()[0].removeprefix("--").replace("-", "_") for line in lines if line.startswith("  --")}
    assert {"model.name", "orchestrator.envs", "trainer.optim.lr"} <= listed
    assert "trainer.micro_batch_tokens" not in listed and "more options" in "\n".join(lines)  # in --help-all


def test_each_key_rl_help_shows_is_a_key() -> None:
    assert [key for key in RLConfig.help_keys if not types_at_path(RLConfig, key.split("."))] == []


def test_the_keys_every_process_of_a_run_shares_are_declared_once() -> None:
    shared = {TrainerConfig: RunKeys, OrchestratorConfig: RunKeys, RLConfig: RunKeys, InferenceConfig: RunDirKeys}
    for config, keys in shared.items():
        assert issubclass(config, keys)
        again = [
            k
            for k in keys.model_fields
            for c in config.__mro__[: config.__mro__.index(keys)]
            if k in vars(c).get("__annotations__", {})
        ]
        assert again == [], f"{config.__name__} declares {again} again: inherit them from {keys.__name__}"


def test_a_key_that_became_a_constant_warns_once_and_is_dropped_wherever_its_table_sits() -> None:
    warnings: list[str] = []
    envs = '[{"id": "reverse-text", "pool": {"min_workers": 1, "idle_timeout_s": 5}, "timeout": {"kill_grace_s": 2}}]'
    overrides = [("orchestrator.envs", envs), ("shutdown-grace-s", "5")]
    rl = resolve_config(RLConfig, overrides=overrides, base=ONE_ENV, warn=warnings.append)
    assert rl.orchestrator.envs[0].pool.min_workers == 1 and len(warnings) == 3
    assert warnings[1].startswith(
        "config key 'orchestrator.envs[0].pool.idle_timeout_s' (from --orchestrator.envs on the command line) is "
        "ignored: an env table's server grows"
    )
    server = resolve_config(
        EnvServerConfig, overrides=[("env.id", "x"), ("pool.idle-timeout-s", "5")], warn=warnings.append
    )
    assert server.pool.idle_timeout_s == 5 and len(warnings) == 3  # the env server's own pool still has the key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [("trainer.max-tokens", "512")],
            "unknown config key 'trainer.max_tokens' (from --trainer.max-tokens on the command line); "
            "did you mean 'trainer.micro_batch_tokens'? (the key was renamed)",
        ),
        ([("shutdown-grace", "5")], "it was removed: fixed at 15 s"),
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
