"""Orchestrator config validation: ratios all-or-none, unique names and addresses, pools, sampling, eval envs."""

import pytest
from pydantic import ValidationError

from envrl.config import ConfigError, resolve_config
from envrl.model.client import TrainClientConfig
from envrl.orchestrator.config import OrchestratorConfig


def resolve(**overrides: object) -> OrchestratorConfig:
    import json

    return resolve_config(OrchestratorConfig, overrides=[(k, json.dumps(v)) for k, v in overrides.items()])


def test_ratios_on_some_train_envs_only_is_an_error_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"set `ratio` on every train env or on none; missing on \['b'\]"):
        resolve(envs=[{"id": "a", "ratio": 1.0}, {"id": "b"}])


def test_duplicate_env_names_are_an_error() -> None:
    with pytest.raises(ConfigError, match=r"env names must be unique; \['x'\]"):
        resolve(envs=[{"id": "x"}, {"id": "y", "name": "x"}])


def test_duplicate_addresses_are_an_error() -> None:
    with pytest.raises(ConfigError, match="share the address tcp://127.0.0.1:5000"):
        resolve(envs=[{"id": "a", "address": "tcp://127.0.0.1:5000"}, {"id": "b", "address": "tcp://127.0.0.1:5000"}])


def test_worker_count_belongs_to_the_pool_table() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown config key 'envs\[0\]\.max_workers'.*did you mean 'envs\[0\]\.pool\.max_workers'"
    ):
        resolve(envs=[{"id": "a", "max_workers": 3}])
    config = resolve(envs=[{"id": "a", "pool": {"min_workers": 3, "max_workers": 3}}])
    assert config.envs[0].pool.min_workers == config.envs[0].pool.max_workers == 3


def test_batch_must_hold_whole_groups() -> None:
    with pytest.raises(ConfigError, match="multiple of group_size"):
        resolve(envs=[{"id": "a"}], batch_size=10, group_size=4)


def test_env_sampling_overrides_single_keys_once() -> None:
    config = resolve(envs=[{"id": "a", "sampling": {"temperature": 0.5}}], sampling={"max_tokens": 7})
    args = config.envs[0].sampling_args(config.sampling)
    assert (args.temperature, args.max_tokens) == (0.5, 7)


def test_unknown_env_sampling_key_is_an_error_naming_the_env() -> None:
    with pytest.raises(ConfigError, match=r"env 'a': unknown sampling keys \['temprature'\]"):
        resolve(envs=[{"id": "a", "sampling": {"temprature": 0.5}}])


def test_typo_in_a_pool_without_type_names_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"'envs\[0\]\.pool\.max_wrkers'.*did you mean 'envs\[0\]\.pool\.max_workers'"
    ):
        resolve(envs=[{"id": "a", "pool": {"max_wrkers": 3}}])


@pytest.mark.parametrize("where", ["run", "env"])
def test_a_zero_temperature_is_an_error_for_train_envs_wherever_it_is_set(where: str) -> None:
    overrides: dict[str, object] = {"envs": [{"id": "a", "sampling": {"temperature": 0.0} if where == "env" else {}}]}
    if where == "run":
        overrides["sampling"] = {"temperature": 0.0}
    with pytest.raises(ConfigError, match=r"train env 'a': sampling.temperature is 0 \(greedy\)"):
        resolve(**overrides)


def test_an_eval_env_may_decode_greedily() -> None:
    config = resolve(envs=[{"id": "a"}], eval={"env": [{"env": "a", "sampling": {"temperature": 0.0}}]})
    assert config.eval_envs()[0].sampling_args(config.sampling).temperature == 0.0


def test_sampling_options_the_trainer_cannot_reproduce_are_refused_for_train_envs_only() -> None:
    with pytest.raises(ConfigError, match=r"env 'a': sampling.extra \['min_p'\] reshape the sampling distribution"):
        resolve(envs=[{"id": "a", "sampling": {"extra": {"min_p": 0.1}}}])
    config = resolve(envs=[{"id": "a"}], eval={"env": [{"env": "a", "sampling": {"extra": {"min_p": 0.1}}}]})
    assert config.eval_envs()[0].sampling_args(config.sampling).extra == {"min_p": 0.1}


def test_a_remote_env_address_needs_curve_keys_or_insecure(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"tcp://10.0.0.7:5000 is not on loopback; give its CURVE keys"):
        resolve(envs=[{"id": "a", "address": "tcp://10.0.0.7:5000"}])
    keys = {
        "server_public_key_file": str(tmp_path / "server.key"),
        "secret_key_file": str(tmp_path / "client.key_secret"),
    }
    assert resolve(envs=[{"id": "a", "address": "tcp://10.0.0.7:5000", "curve": keys}]).envs[0].curve is not None
    assert resolve(envs=[{"id": "a", "address": "tcp://10.0.0.7:5000", "insecure": True}]).envs[0].insecure


def test_a_sampling_seed_is_refused_since_rollout_seeds_derive_from_the_run_seed() -> None:
    with pytest.raises(ConfigError, match=r"'sampling\.seed'"):
        resolve(envs=[{"id": "a"}], sampling={"seed": 3})
    with pytest.raises(ConfigError, match=r"env 'a': unknown sampling keys \['seed'\] \(every rollout's seed derives"):
        resolve(envs=[{"id": "a", "sampling": {"seed": 3}}])


def test_a_typo_in_the_sampling_table_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'sampling\.temprature'.*did you mean 'sampling\.temperature'"):
        resolve(envs=[{"id": "a"}], sampling={"temprature": 0.5})


@pytest.mark.parametrize(
    ("base_url", "problem"),
    [([], "base_url is an empty list; give at least one inference server URL"), (["http://a:8000", " "], r"\[1\]")],
)
def test_inference_and_train_client_urls_are_checked_alike(base_url: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"inference\.base_url.*{problem}"):
        resolve(envs=[{"id": "a"}], inference={"base_url": base_url})
    with pytest.raises(ValidationError, match=rf"base_url\n.*{problem}"):
        TrainClientConfig(base_url=base_url, model="m")
    replicas = ["http://a:8000", "http://b:8001"]
    assert resolve(envs=[{"id": "a"}], inference={"base_url": replicas}).inference.base_urls == replicas
    assert TrainClientConfig(base_url="http://a:8000", model="m").base_urls == ["http://a:8000"]


def test_an_eval_env_is_its_declared_envs_server_keys_with_its_own_scoring_and_sampling() -> None:
    train = {
        "id": "learnable",
        "args": {"num_eval": 8},
        "ratio": 2.0,
        "pool": {"min_workers": 1, "max_workers": 1},
        "sampling": {"temperature": 0.7, "top_p": 0.9},
    }
    table = {"env": "learnable", "num_examples": 4, "sampling": {"temperature": 0.0}}
    config = resolve(envs=[train], eval={"env": [table]})
    (env,), (scoring,) = config.eval_envs(), config.eval.env
    assert (env.name, env.id, env.args, scoring.num_examples) == ("learnable", "learnable", {"num_eval": 8}, 4)
    assert "num_examples" not in type(env).model_fields, "the env and how it is scored stay apart"
    assert env.sampling == {"temperature": 0.0, "top_p": 0.9}
    assert env.pool.max_workers == 1 and "ratio" not in type(env).model_fields


def test_an_eval_only_env_is_declared_with_train_false_and_never_trained_on() -> None:
    config = resolve(envs=[{"id": "a"}, {"id": "b", "train": False}], eval={"env": [{"env": "b", "pass_at": [1]}]})
    assert [env.resolved_name for env in config.train_envs] == ["a"]
    assert [env.resolved_name for env in config.eval_envs()] == ["b"]


def test_ratio_on_an_env_not_trained_on_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"env 'b': `ratio` is a share of training"):
        resolve(envs=[{"id": "a"}, {"id": "b", "train": False, "ratio": 1.0}], eval={"env": [{"env": "b"}]})


def test_a_run_needs_a_train_env_and_an_eval_only_env_an_eval_table() -> None:
    with pytest.raises(ConfigError, match=r"every env has `train = false`"):
        resolve(envs=[{"id": "a", "train": False}], eval={"env": [{"env": "a"}]})
    with pytest.raises(ConfigError, match=r"envs \['b'\] have `train = false` but no eval table names them"):
        resolve(envs=[{"id": "a"}, {"id": "b", "train": False}])


def test_an_eval_env_naming_no_declared_env_is_an_error_listing_them() -> None:
    with pytest.raises(ConfigError, match=r"env 'lernable' is not a declared env; did you mean 'learnable'\? envs"):
        resolve(envs=[{"id": "a"}, {"id": "learnable"}], eval={"env": [{"env": "lernable"}]})
    with pytest.raises(ConfigError, match=r"missing `env`: name an env of \[\[orchestrator.envs\]\]"):
        resolve(envs=[{"id": "a"}], eval={"env": [{"num_examples": 3}]})
    with pytest.raises(ConfigError, match=r"\['a'\] evaluated twice"):
        resolve(envs=[{"id": "a"}], eval={"env": [{"env": "a"}, {"env": "a"}]})


@pytest.mark.parametrize("key", ["id", "args", "pool", "address", "ratio", "name"])
def test_an_env_key_in_an_eval_table_says_to_declare_the_env(key: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"unknown config key 'eval.env\[0\].{key}'.*removed: .*declare it in \[\[orchestrator.envs\]\] "
        r"\(with `train = false` for an eval-only env\) and name it here with env =",
    ):
        resolve(envs=[{"id": "a"}], eval={"env": [{"env": "a", key: {"x": 1} if key in ("args", "pool") else "b"}]})


def test_train_env_was_renamed_env() -> None:
    with pytest.raises(
        ConfigError, match=r"'eval.env\[0\].train_env'.*did you mean 'eval.env\[0\].env'\? \(the key was renamed\)"
    ):
        resolve(envs=[{"id": "a"}], eval={"env": [{"train_env": "a"}]})


def test_an_eval_env_has_no_schedule_of_its_own() -> None:
    with pytest.raises(
        ConfigError, match=r"'eval.env\[0\].interval'.*removed: one schedule .*orchestrator.eval.interval"
    ):
        resolve(envs=[{"id": "a"}], eval={"env": [{"env": "a", "interval": 5}]})


def test_max_inflight_defaults_to_the_batches_generation_may_run_ahead() -> None:
    assert resolve(envs=[{"id": "a"}], batch_size=8, group_size=4, max_async_level=2).inflight_limit == 24
    assert resolve(envs=[{"id": "a"}], batch_size=8, group_size=4, max_inflight=5).inflight_limit == 5


def test_an_envs_own_client_is_a_chat_client() -> None:
    teacher = {"base_url": "https://api.example.com/v1", "model": "teacher", "api_key_env": "KEY"}
    assert resolve(envs=[{"id": "a", "client": teacher}]).envs[0].client.model == "teacher"
    with pytest.raises(
        ConfigError, match=r"'envs\[0\].client'.*type = 'scripted' was removed: an env's own client is a chat"
    ):
        resolve(envs=[{"id": "a", "client": {"type": "scripted", "replies": ["x"]}}])
    with pytest.raises(ConfigError, match=r"'envs\[0\].client'.*type = 'eval' was removed.*drop `type`"):
        resolve(envs=[{"id": "a", "client": {"type": "eval", **teacher}}])


def test_pass_env_names_only_variable_names() -> None:
    with pytest.raises(
        ConfigError, match=r"'envs\[0\].pass_env'.*\['MY-KEY', '1X'\] are not environment variable names"
    ):
        resolve(envs=[{"id": "a", "pass_env": ["OK_KEY", "MY-KEY", "1X"]}])


def test_rl_eval_s_env_table_refuses_a_schedule_naming_the_one_rl_eval_has() -> None:
    from envrl.eval.config import EvalCommandConfig

    overrides = [("env", '[{"id": "a", "interval": 5}]')]
    with pytest.raises(ConfigError, match=r"'env\[0\].interval'.*removed: one schedule .*`rl eval` evaluates once"):
        resolve_config(EvalCommandConfig, overrides=overrides)
