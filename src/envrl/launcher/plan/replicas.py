"""The inference replicas of an `rl` run: one vLLM server per replica, each on a port of its own.

Guarantee: replica i of k serves on `inference.port + i` with the run's inference options, is
named `inference` (k = 1) or `inference-<i>`, which names its config (`configs/<name>.toml`) and
its log (`logs/<name>.log`).
"""

from __future__ import annotations

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig


def replica_name(index: int, count: int) -> str:
    return "inference" if count == 1 else f"inference-{index}"


def replica_configs(inference: InferenceConfig, count: int) -> dict[str, InferenceConfig]:
    """Each of `count` replicas' own config, by replica name: one server each, on its own port."""
    last = inference.port + count - 1
    if last > 65535:
        raise ConfigError(
            f"placement.inference.replicas = {count} from inference.port = {inference.port} needs ports up to "
            f"{last}, past 65535: lower inference.port"
        )
    return {replica_name(i, count): inference.model_copy(update={"port": inference.port + i}) for i in range(count)}
