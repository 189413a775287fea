"""The config loader: merge order, overrides, unions, and one-line errors with exit code 2."""

import tomllib
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field, field_validator

from envrl.config import BaseConfig, ConfigError, load_config, resolve_config
from envrl.config_migrations import Migration


class OptimConfig(BaseConfig):
    lr: float = 1e-5
    """Peak learning rate."""
    betas: list[float] = [0.9, 0.99]


class StaticPool(BaseConfig):
    type: Literal["static"] = "static"
    num_workers: int = 1


class ElasticPool(BaseConfig):
    type: Literal["elastic"] = "elastic"
    max_workers: int = 4


class EnvConfig(BaseConfig):
    id: str
    args: dict[str, int | str] = {}
    pool: Annotated[StaticPool | ElasticPool, Field(discriminator="type")] = ElasticPool()


class TrainerConfig(BaseConfig):
    optim: OptimConfig = OptimConfig()
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    micro_batch_tokens: int = 4096


class RunConfig(BaseConfig):
    trainer: TrainerConfig = TrainerConfig()
    envs: list[EnvConfig] = []
    name: str = "run"
    seed: int = 0


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        load_config(RunConfig, argv, prog="test")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, f"expected one line, got: {err!r}"
    return err.strip()


def test_later_files_deep_merge_over_earlier(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "name = 'a'\n[trainer.optim]\nlr = 1e-4\nbetas = [0.5, 0.6]\n")
    b = write(tmp_path, "b.toml", "[trainer.optim]\nlr = 3e-4\n")
    config = resolve_config(RunConfig, [a, b])
    assert config.trainer.optim.lr == 3e-4
    assert config.trainer.optim.betas == [0.5, 0.6]
    assert config.name == "a"


def test_cli_overrides_come_last_in_kebab_or_snake_case(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[trainer.optim]\nlr = 1e-4\n")
    config = load_config(
        RunConfig,
        ["--config", str(a), "--trainer.optim.lr", "2e-3", "--trainer.activation-checkpointing", "--seed=7"],
        prog="test",
    )
    assert config.trainer.optim.lr == 2e-3
    assert config.trainer.activation_checkpointing is True
    assert config.seed == 7


def test_no_flag_sets_boolean_false(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[trainer]\nactivation_checkpointing = true\n")
    config = load_config(RunConfig, ["--config", str(a), "--trainer.no-activation-checkpointing"], prog="test")
    assert config.trainer.activation_checkpointing is False


def test_lists_and_dicts_are_json_and_strings_stay_strings() -> None:
    config = load_config(
        RunConfig,
        ["--trainer.optim.betas", "[0.1, 0.2]", "--envs", '[{"id": "x", "args": {"n": 3}}]', "--name", "123"],
        prog="test",
    )
    assert config.trainer.optim.betas == [0.1, 0.2]
    assert config.envs[0].args == {"n": 3}
    assert config.name == "123"


def test_discriminated_union_selected_by_type(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nid = 'x'\npool = {type = 'static', num_workers = 3}\n[[envs]]\nid = 'y'\n")
    config = resolve_config(RunConfig, [a])
    assert isinstance(config.envs[0].pool, StaticPool) and config.envs[0].pool.num_workers == 3
    assert isinstance(config.envs[1].pool, ElasticPool)


def test_unknown_key_names_dotted_key_file_and_closest_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[trainer.optim]\nlrr = 1e-4\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "'trainer.optim.lrr'" in err
    assert str(a) in err
    assert "did you mean 'trainer.optim.lr'" in err


def test_unknown_key_inside_union_member_suggests_that_members_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nid = 'x'\npool = {type = 'static', num_wrkers = 3}\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "'envs[0].pool.num_wrkers'" in err and "did you mean 'envs[0].pool.num_workers'" in err


def test_unknown_cli_key_is_attributed_to_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = load_error(capsys, ["--traner.optim.lr", "1"])
    assert "'traner'" in err and "command line" in err and "did you mean 'trainer'" in err


MIGRATIONS = (
    Migration("TrainerConfig", "max_tokens", "micro_batch_tokens", removed_in="0.2.0"),
    Migration("TrainerConfig", "learning_rate", "optim.lr", removed_in="0.2.0"),
    Migration("RunConfig", "trainer.checkpointing", "trainer.activation_checkpointing", removed_in="99.0"),
    Migration("RunConfig", "run_name", None, removed_in="99.0", note="runs are named by their output_dir"),
)
"""Two keys refused since 0.2.0 (a nested table's), one moved and one removed that still work until 99.0."""


def test_a_renamed_key_is_refused_naming_its_new_key(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[trainer]\nmax_tokens = 512\n")
    with pytest.raises(ConfigError) as refused:
        resolve_config(RunConfig, [a], migrations=MIGRATIONS)
    assert str(refused.value) == (
        f"unknown config key 'trainer.max_tokens' (from {a}); did you mean 'trainer.micro_batch_tokens'? "
        "(the key was renamed)"
    )
    with pytest.raises(ConfigError, match=r"did you mean 'trainer.optim.lr'\? \(the key was renamed\)"):
        resolve_config(RunConfig, overrides=[("trainer.learning-rate", "1e-3")], migrations=MIGRATIONS)


def test_a_moved_key_still_works_with_one_warning_line_naming_the_new_key(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", 'run_name = "x"\n[trainer]\ncheckpointing = true\n')
    warned: list[str] = []
    config = resolve_config(RunConfig, [a], warn=warned.append, migrations=MIGRATIONS)
    assert config.trainer.activation_checkpointing is True
    assert warned == [
        f"config key 'trainer.checkpointing' (from {a}) is now 'trainer.activation_checkpointing': rename it; "
        "from envrl 99.0 the old key is an error",
        f"config key 'run_name' (from {a}) is ignored: runs are named by their output_dir; from envrl 99.0 it is "
        "an error",
    ]
    both = [("trainer.checkpointing", "true"), ("trainer.activation-checkpointing", "false")]
    with pytest.raises(ConfigError, match="was renamed to 'trainer.activation_checkpointing', which is set too"):
        resolve_config(RunConfig, overrides=both, migrations=MIGRATIONS)


def test_a_moved_key_past_its_version_is_refused_naming_the_new_key() -> None:
    gone = [Migration("RunConfig", "trainer.checkpointing", "trainer.activation_checkpointing", removed_in="0.1")]
    with pytest.raises(ConfigError) as refused:
        resolve_config(RunConfig, overrides=[("trainer.checkpointing", "true")], migrations=gone)
    assert str(refused.value) == (
        "unknown config key 'trainer.checkpointing' (from --trainer.checkpointing on the command line); did you "
        "mean 'trainer.activation_checkpointing'? (the key was renamed)"
    )


def test_wrong_type_names_key_source_and_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[trainer.optim]\nlr = 'fast'\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "'trainer.optim.lr'" in err and str(a) in err and "'fast'" in err


def test_bad_union_tag_lists_expected_tags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nid = 'x'\npool = {type = 'dynamic'}\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "'envs[0].pool.type'" in err and "'static'" in err and "'elastic'" in err


def test_missing_required_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nargs = {n = 1}\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "missing" in err and "'envs[0].id'" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = load_error(capsys, ["--config", str(tmp_path / "nope.toml")])
    assert "not found" in err and "nope.toml" in err


def test_invalid_toml_names_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[trainer\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "not valid TOML" in err and str(a) in err


def test_value_required_for_non_boolean_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = load_error(capsys, ["--seed"])
    assert "--seed needs a value" in err


def test_dry_run_prints_resolved_toml_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nid = 'x'\npool = {type = 'static', num_workers = 2}\n")
    with pytest.raises(SystemExit) as exit_info:
        load_config(RunConfig, ["--config", str(a), "--trainer.optim.lr", "5e-4", "--dry-run"], prog="test")
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    resolved = tomllib.loads(printed)
    assert resolved["trainer"]["optim"]["lr"] == 5e-4
    assert resolved["envs"][0]["pool"] == {"type": "static", "num_workers": 2}
    assert RunConfig.model_validate(resolved) == resolve_config(RunConfig, [a], [("trainer.optim.lr", "5e-4")])


def test_help_lists_keys_with_field_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(RunConfig, ["--help"], prog="test")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "  --trainer.optim.lr\n      Peak learning rate." in out
    assert "  --trainer.activation-checkpointing\n      Recompute activations" in out


def test_environment_variables_are_not_a_config_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED", "5")
    monkeypatch.setenv("seed", "5")
    assert resolve_config(RunConfig).seed == 0


def test_resolve_config_raises_config_error_without_exiting() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        resolve_config(RunConfig, overrides=[("bogus", "1")])


def test_union_without_type_key_asks_for_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a.toml", "[[envs]]\nid = 'x'\npool = {num_workers = 3}\n")
    err = load_error(capsys, ["--config", str(a)])
    assert "'envs[0].pool'" in err and "needs a 'type'" in err and "'static'" in err


class ShortFlagsConfig(RunConfig):
    cli_aliases = {"s": "seed", "l": "trainer.optim.lr"}


def test_short_flags_declared_by_the_config_mean_their_long_keys() -> None:
    config = load_config(ShortFlagsConfig, ["-s", "7", "-l=0.5", "--name", "-s"], prog="test")
    assert (config.seed, config.trainer.optim.lr, config.name) == (7, 0.5, "-s")


def test_undeclared_short_flag_is_an_error_listing_the_declared_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(ShortFlagsConfig, ["-x", "1"], prog="test")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'-x'" in err and "-s (--seed)" in err and "-l (--trainer.optim.lr)" in err


def test_help_shows_short_flags_beside_their_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_config(ShortFlagsConfig, ["--help"], prog="test")
    out = capsys.readouterr().out
    assert "--seed, -s" in out and "  --trainer.optim.lr, -l\n      Peak learning rate." in out


class OneOrManyConfig(BaseConfig):
    envs: list[EnvConfig] = []

    @field_validator("envs", mode="before")
    @classmethod
    def _one_table_is_one_env(cls, value: object) -> object:
        return [value] if isinstance(value, dict) else value


def test_a_single_table_for_a_list_of_tables_is_typed_and_checked_as_an_item(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = load_config(OneOrManyConfig, ["--envs.id", "123", "--envs.args", '{"n": 1}'], prog="test")
    assert config.envs[0].id == "123" and config.envs[0].args == {"n": 1}
    with pytest.raises(SystemExit):
        load_config(OneOrManyConfig, ["--envs.id", "x", "--envs.agrs", "{}"], prog="test")
    assert "unknown config key 'envs.agrs'" in (err := capsys.readouterr().err) and "did you mean 'envs.args'?" in err
