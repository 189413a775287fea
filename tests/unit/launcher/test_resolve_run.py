"""`resolve_run`: one RLConfig becomes each process's complete config, and bad combinations are errors."""

from pathlib import Path

import pytest

from envrl.config import ConfigError, config_help, resolve_config
from envrl.launcher.config import EVAL_PORT_OFFSET, RLConfig, resolve_run

TWO_TRAIN_TWO_EVAL = [
    ("orchestrator.envs", '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "second"}]'),
    ("orchestrator.eval.env", '[{"env": "reverse-text"}, {"env": "second"}]'),
]


def rl_config(*overrides: tuple[str, str]) -> RLConfig:
    return resolve_config(RLConfig, overrides=[("orchestrator.envs", '[{"id": "reverse-text"}]'), *overrides])


def test_shared_keys_reach_every_process_that_has_them(tmp_path: Path) -> None:
    rl = rl_config(
        ("model.name", "some/model"),
        ("output-dir", str(tmp_path)),
        ("max-steps", "7"),
        ("max-async-level", "2"),
        ("seed", "3"),
        ("resume", None),
    )
    run = resolve_run(rl)
    for process in (run.trainer, run.orchestrator):
        assert (process.model.name, process.output_dir, process.max_steps) == ("some/model", tmp_path, 7)
        assert (process.max_async_level, process.seed, process.resume) == (2, 3, True)
    assert (run.inference.model.name, run.inference.output_dir) == ("some/model", tmp_path)


@pytest.mark.parametrize("key", ["trainer.seed", "orchestrator.max-steps", "inference.output-dir"])
def test_a_shared_key_set_inside_a_section_is_an_error_naming_it(key: str) -> None:
    rl = rl_config((key, "5"))
    dotted = key.replace("-", "_")
    with pytest.raises(ConfigError, match=f"'{dotted}' is shared by every process: set '{dotted.split('.')[1]}'"):
        resolve_run(rl)


@pytest.mark.parametrize(
    ("key", "value", "owner", "source"),
    [
        ("orchestrator.inference.base-url", "http://127.0.0.1:9", "orchestrator.inference", "the inference servers"),
        ("orchestrator.inference.retry.max-retries", "3", "orchestrator.inference", "the inference servers"),
        ("orchestrator.inference.ready-timeout-s", "3", "orchestrator.inference", r"the inference .*ready_timeout_s\)"),
        ("trainer.resume", "true", "trainer.resume", "--resume"),
    ],
)
def test_a_key_rl_sets_itself_is_refused_naming_where_it_comes_from(
    key: str, value: str, owner: str, source: str
) -> None:
    with pytest.raises(ConfigError, match=f"'{owner}' is set by rl from {source}"):
        resolve_run(rl_config((key, value)))


def test_the_inference_start_up_limit_is_the_inference_sections_and_the_orchestrator_waits_as_long() -> None:
    run = resolve_run(rl_config(("inference.ready-timeout-s", "42")))
    assert run.inference.ready_timeout_s == run.orchestrator.inference.ready_timeout_s == 42


def test_rl_help_leaves_out_the_keys_rl_sets_itself() -> None:
    flags = {line.split()[0] for line in config_help(RLConfig, "rl").splitlines() if line.startswith("  --")}
    assert "--output-dir" in flags and "--inference.port" in flags
    assert not flags & {"--trainer.output-dir", "--orchestrator.seed", "--orchestrator.inference.base-url"}


def test_the_orchestrator_reaches_the_inference_server_the_launcher_starts() -> None:
    run = resolve_run(rl_config(("inference.port", "8123")))
    assert run.orchestrator.inference.base_url == run.inference.base_url
    assert run.inference.base_url.endswith(":8123")


def test_train_and_eval_env_servers_get_consecutive_ports_in_their_own_blocks() -> None:
    run = resolve_run(rl_config(*TWO_TRAIN_TWO_EVAL, ("env-server-base-port", "7100")))
    eval_base = 7100 + EVAL_PORT_OFFSET
    expected = [
        ("train", "reverse-text", "tcp://127.0.0.1:7100"),
        ("train", "second", "tcp://127.0.0.1:7101"),
        ("eval", "reverse-text", f"tcp://127.0.0.1:{eval_base}"),
        ("eval", "second", f"tcp://127.0.0.1:{eval_base + 1}"),
    ]
    assert [(s.split, s.name, s.config.address) for s in run.env_servers] == expected
    # The orchestrator connects to exactly the addresses the servers bind.
    addresses = [env.address for env in [*run.orchestrator.envs, *run.orchestrator.eval_envs()]]
    assert addresses == [address for _, _, address in expected]


def test_an_eval_only_env_gets_an_eval_server_only_and_an_external_env_none() -> None:
    envs = (
        '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "held-out", "train": false},'
        ' {"id": "reverse-text", "name": "far", "address": "tcp://127.0.0.1:7900"}]'
    )
    evals = '[{"env": "held-out"}, {"env": "far"}]'
    run = resolve_run(rl_config(("orchestrator.envs", envs), ("orchestrator.eval.env", evals)))
    expected = [("train", "reverse-text", "tcp://127.0.0.1:5000"), ("eval", "held-out", "tcp://127.0.0.1:6000")]
    assert [(s.split, s.name, s.config.address) for s in run.env_servers] == expected
    # the external server answers both the train and the eval rollouts of its env
    assert [env.address for env in run.orchestrator.eval_envs()] == ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:7900"]


def test_an_env_with_its_own_address_gets_no_server_and_keeps_its_address() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://127.0.0.1:7900"}, {"id": "reverse-text", "name": "b"}]'
    run = resolve_run(rl_config(("orchestrator.envs", envs)))
    assert [(s.name, s.config.address) for s in run.env_servers] == [("b", "tcp://127.0.0.1:5001")]
    assert run.orchestrator.envs[0].address == "tcp://127.0.0.1:7900"


def test_each_env_server_gets_its_envs_spec_pool_timeout_and_the_runs_restarts() -> None:
    envs = (
        '[{"id": "reverse-text", "args": {"max_len": 5}, "pool": {"type": "static", "num_workers": 3},'
        ' "timeout": {"rollout_s": 12.5}}]'
    )
    run = resolve_run(rl_config(("orchestrator.envs", envs), ("restarts.max-restarts", "4")))
    (server,) = run.env_servers
    assert (server.config.env.id, server.config.env.args) == ("reverse-text", {"max_len": 5})
    assert server.config.pool.type == "static" and server.config.pool.num_workers == 3
    assert server.config.timeout.rollout_s == 12.5
    assert server.restarts.max_restarts == run.orchestrator.restarts.max_restarts == 4


def test_an_envs_own_restarts_is_refused_naming_the_runs() -> None:
    with pytest.raises(
        ConfigError,
        match=r"'orchestrator.envs\[0\].restarts'.*removed: one restart policy: under rl .*top-level `restarts`",
    ):
        rl_config(("orchestrator.envs", '[{"id": "reverse-text", "restarts": {"max_restarts": 4}}]'))
    with pytest.raises(ConfigError, match=r"'orchestrator.restarts' is set by rl from restarts"):
        resolve_run(rl_config(("orchestrator.restarts.max-restarts", "4")))


def test_an_eval_port_block_reaching_the_inference_port_is_an_error_naming_both() -> None:
    rl = rl_config(*TWO_TRAIN_TWO_EVAL, ("env-server-base-port", "7000"), ("inference.port", "8001"))
    with pytest.raises(ConfigError, match=r"inference and eval env 'second' would both use port 8001"):
        resolve_run(rl)


def test_an_env_address_inside_the_train_port_block_is_an_error() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://localhost:5001"}, {"id": "reverse-text", "name": "b"}]'
    with pytest.raises(
        ConfigError, match=r"train env 'b' and train env 'reverse-text' \(its address\) would both use port 5001"
    ):
        resolve_run(rl_config(("orchestrator.envs", envs)))


def test_the_same_port_on_another_host_is_no_overlap() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://10.0.0.7:8000", "insecure": true}]'
    (env,) = resolve_run(rl_config(("orchestrator.envs", envs))).orchestrator.envs
    assert env.address == "tcp://10.0.0.7:8000"


def test_weights_of_every_checkpoint_are_kept_unless_the_user_says_otherwise() -> None:
    run = resolve_run(rl_config(("trainer.ckpt.interval", "7")))
    assert run.orchestrator.keep_weights_every == 7
    run = resolve_run(rl_config(("trainer.ckpt.interval", "7"), ("orchestrator.keep-weights-every", "0")))
    assert run.orchestrator.keep_weights_every == 0
