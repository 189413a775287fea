"""Replica i of k of an `rl` run serves on `inference.port + i` with the run's inference options, named `inference`
or `inference-<i>`, which names its config and its log."""

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
