"""`env_plan` (each env by `plan_env`), the one pure place that decides for `rl`, `rl eval` and a standalone
orchestrator whether a server is external or spawned, its model client and the complete launch of a spawned one."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from envrl.config import config_to_toml
from envrl.data.traces import Split
from envrl.envclient.config import EnvConfig
from envrl.model.client import ClientConfig
from envrl.runtime.restarts import RestartPolicy
from envrl.serve.config import CurveClientConfig, CurveServerConfig
from envrl.serve.launch import EnvServerLaunch

SIDECAR_ADDRESS = "tcp://127.0.0.1:0"
"""Where a spawned server binds when its planner names no port: a free loopback port, reported at start."""

E = TypeVar("E", bound=EnvConfig)


@dataclass(frozen=True)
class PlannedEnv(Generic[E]):
    """One env of a process: its table as a client connects to it, its model client, and the
    server to spawn (None: the server is external, at `env.address`)."""

    split: Split
    env: E
    """The env as its handle connects: `address` and `curve` of an external server, or of the
    spawned one (its client keys); `address` None for a sidecar, known once it is started."""
    client: ClientConfig
    """The model client its rollouts use: the env's own `client`, else the run's (`plan_env`)."""
    server: EnvServerLaunch | None

    @property
    def name(self) -> str:
        return self.env.resolved_name


def plan_env(
    env: E,
    split: Split,
    client: ClientConfig,
    restarts: RestartPolicy,
    *,
    curve: tuple[CurveServerConfig, CurveClientConfig],
    address: str | None = None,
) -> PlannedEnv[E]:
    """`env`'s rollouts of `split` on its own `client` if it has one, else on `client` (the run's):
    at its own `address` if it has one (external), else on a server spawned at `address`
    (default: a free loopback port) that serves that client,
    restarted per `restarts`, and admits only the holder of `curve`'s client keys (`curve`: the
    server's keys, its client's: `envclient/curve.py`), which the env then connects with."""
    client = env.own_client or client
    if env.address is not None:
        return PlannedEnv(split, env, client, None)
    server_keys, client_keys = curve
    launch = env.server_launch(split, address or SIDECAR_ADDRESS, client, restarts, server_keys)
    return PlannedEnv(split, env.model_copy(update={"address": address, "curve": client_keys}), client, launch)


def env_plan(
    train: Sequence[E],
    evals: Sequence[E],
    client: ClientConfig,
    restarts: RestartPolicy,
    *,
    curve: tuple[CurveServerConfig, CurveClientConfig],
    address: Callable[[Split, int], str] | None = None,
) -> list[PlannedEnv[E]]:
    """The `train` envs, then the `evals`, in order, each planned by `plan_env` on `client` (the
    run's), its spawned server restarted per `restarts`, behind `curve`, bound at `address(split,
    i)` (i: the env's index among its split's envs; default: a free loopback port)."""
    splits: list[tuple[Split, Sequence[E]]] = [("train", train), ("eval", evals)]
    return [
        plan_env(env, split, client, restarts, curve=curve, address=None if address is None else address(split, i))
        for split, envs in splits
        for i, env in enumerate(envs)
    ]


def dry_run_text(title: str, config: BaseModel, planned: Sequence[PlannedEnv], output_dir: Path) -> str:
    """What an entry point's `--dry-run` prints: `# title`, its resolved `config`, then each planned
    env's server (`describe`)."""
    return "\n".join([f"# {title}", config_to_toml(config).rstrip("\n"), *describe(planned, output_dir), ""])


def describe(planned: Sequence[PlannedEnv], output_dir: Path) -> list[str]:
    """`--dry-run`'s lines for `planned`: each external server's address, each spawned server's
    config and command (the config read from its file under `output_dir`), and what each sees
    beyond the environment allow-list."""
    lines = []
    for env in planned:
        if env.server is None:
            lines.append(f"# {env.split} env {env.name!r}: external server at {env.env.address}")
            continue
        where = "a free loopback port" if env.server.config.address == SIDECAR_ADDRESS else env.server.config.address
        seen = ", ".join(env.server.allowed_env()) or "nothing"
        assert env.env.curve is not None  # plan_env: a spawned server admits only its client
        lines += [
            f"# {env.server.title}, spawned on {where}; variables beyond the allow-list: {seen}",
            f"# it admits only the holder of {env.env.curve.secret_key_file} (CURVE keys made before it starts)",
            config_to_toml(env.server.config).rstrip("\n"),
            shlex.join(env.server.argv(env.server.config_file(output_dir))),
        ]
    return lines
