"""Env server config: loopback rules, pool union, and passing a config to a child process intact."""

import os
from pathlib import Path

import pytest
import zmq.auth

from envrl.config import ConfigError, _split_argv, resolve_config
from envrl.runtime.net import is_loopback
from envrl.runtime.process import config_argv
from envrl.serve.config import EnvServerConfig, PoolConfig, load_secret_certificate


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("tcp://127.0.0.1:5000", True),
        ("tcp://127.3.2.1:0", True),
        ("tcp://localhost:5000", True),
        ("tcp://[::1]:5000", True),
        ("ipc:///tmp/x", True),
        ("tcp://0.0.0.0:5000", False),
        ("tcp://*:5000", False),
        ("tcp://10.0.0.5:5000", False),
        ("tcp://eth0:5000", False),
    ],
)
def test_loopback_addresses_are_recognised(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_default_pool_grows_from_one_worker_and_a_fixed_pool_is_min_equal_to_max() -> None:
    assert EnvServerConfig(env={"id": "x"}).pool.min_workers == 1
    config = resolve_config(
        EnvServerConfig, overrides=[("env.id", "x"), ("pool.min-workers", "3"), ("pool.max-workers", "3")]
    )
    assert config.pool.min_workers == config.pool.max_workers == 3


@pytest.mark.parametrize(
    ("pool", "fix"),
    [
        ({"type": "static", "num_workers": 4}, "type = 'static' and num_workers = 4 were removed (one pool shape): "
         "set min_workers = max_workers = 4"),
        ({"num_workers": 2}, "num_workers = 2 was removed (one pool shape): set min_workers = max_workers = 2"),
        ({"type": "static"}, "set min_workers = max_workers = 1"),
        ({"type": "elastic", "max_workers": 3}, "type = 'elastic' was removed (one pool shape): drop it"),
    ],
)  # fmt: skip
def test_the_former_pool_types_keys_are_refused_naming_the_keys_that_replace_them(pool: dict, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_config(EnvServerConfig, base={"env": {"id": "x"}, "pool": pool})
    assert "'pool'" in str(error.value) and fix in str(error.value)


def test_exposed_address_needs_curve_keys_or_insecure() -> None:
    with pytest.raises(ConfigError, match="curve.secret_key_file.*--insecure"):
        resolve_config(EnvServerConfig, overrides=[("env.id", "x"), ("address", "tcp://0.0.0.0:5000")])
    config = resolve_config(
        EnvServerConfig, overrides=[("env.id", "x"), ("address", "tcp://0.0.0.0:5000"), ("insecure", None)]
    )
    assert config.insecure


def test_elastic_min_above_max_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError, match="min_workers .3. is above max_workers .2."):
        resolve_config(EnvServerConfig, overrides=[("env.id", "x"), ("pool", '{"min_workers": 3, "max_workers": 2}')])


def test_config_argv_rebuilds_the_same_config_in_a_child() -> None:
    config = EnvServerConfig(
        env={"id": "pkg.mod:load", "args": {"n": 3, "name": "a b"}},
        address="tcp://127.0.0.1:0",
        pool=PoolConfig(min_workers=2, max_workers=2, multiplex=8),
        timeout={"rollout_s": None, "scoring_s": 5},
        log={"file": "/tmp/x.log"},
        client={"type": "eval", "base_url": "http://127.0.0.1:8000/v1", "model": "m", "extra_body": {"k": [1]}},
    )
    parsed = _split_argv(config_argv(config))
    assert resolve_config(EnvServerConfig, parsed.config_files, parsed.overrides) == config


def test_model_access_is_refused_naming_the_client_that_replaced_it() -> None:
    """Protocol 3: a server serves the one client of its config; what it may reach is that client."""
    with pytest.raises(ConfigError) as error:
        resolve_config(EnvServerConfig, overrides=[("env.id", "x"), ("model-access", '{"base_urls": []}')])
    assert "'model_access'" in str(error.value) and "`client`" in str(error.value) and "--client" in str(error.value)
    config = resolve_config(EnvServerConfig, overrides=[("env.id", "x"), ("client", '{"type": "scripted"}')])
    assert config.client is not None and config.client.type == "scripted"


def test_a_secret_key_other_users_can_read_is_refused_naming_the_fix(tmp_path: Path) -> None:
    _, secret = zmq.auth.create_certificates(tmp_path, "server")
    os.chmod(secret, 0o644)
    with pytest.raises(
        ValueError, match=rf"curve.secret_key_file {secret} is readable by other users \(mode 644\): run `chmod 600"
    ):
        load_secret_certificate(Path(secret), "curve.secret_key_file")
    os.chmod(secret, 0o600)
    public, key = load_secret_certificate(Path(secret), "curve.secret_key_file")
    assert len(public) == len(key) == 40
