"""`env_plan(config)`, pure: per train env then eval env, the model client its rollouts use and the server they go
to; the orchestrator connects and spawns exactly what it plans, each server admitting only its CURVE key."""

from __future__ import annotations

from collections.abc import Callable

from envrl.config import config_to_toml
from envrl.data.traces import Split
from envrl.envclient.config import EnvConfig
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.plan import PlannedEnv, describe, plan_env
from envrl.model.client import ClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.serve.config import CurveClientConfig, CurveServerConfig


def env_plan(
    config: OrchestratorConfig,
    *,
    client: ClientConfig | None = None,
    address: Callable[[Split, int], str] | None = None,
    curve: tuple[CurveServerConfig, CurveClientConfig] | None = None,
) -> list[PlannedEnv[EnvConfig]]:
    """Every env of `config`: train envs (`train_envs`), then eval envs (`eval_envs()`), in order.
    `client` replaces the run's train client; a spawned server binds `address(split, i)` (i: the
    env's index among its split's envs; default: a free loopback port) behind `curve` (default:
    the sidecars' keys in `output_dir`, which `Sidecars` makes; `plan_env`)."""
    run_client = client or config.train_client()
    keys = curve if curve is not None else sidecar_keys(config.output_dir)
    planned: list[PlannedEnv[EnvConfig]] = []
    splits: list[tuple[Split, list[EnvConfig]]] = [("train", [*config.train_envs]), ("eval", config.eval_envs())]
    for split, envs in splits:
        for i, env in enumerate(envs):
            where = None if address is None else address(split, i)
            planned.append(plan_env(env, split, run_client, config.restarts, curve=keys, address=where))
    return planned


def dry_run_text(config: OrchestratorConfig) -> str:
    """What `orchestrator --dry-run` prints: its config, then each env's server (`describe`)."""
    return "\n".join(
        ["# orchestrator", config_to_toml(config).rstrip("\n"), *describe(env_plan(config), config.output_dir), ""]
    )
