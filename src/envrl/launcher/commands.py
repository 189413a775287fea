"""The command line, environment and log file of every process `rl` starts.

Guarantee: `rl` starts exactly the commands `rl --dry-run` prints, since both come from
`launch_plan`; `env` holds only what differs from `rl`'s own environment. Every run has a fresh
random `/update_weights` token (or the one already in `rl`'s environment), handed to the inference
servers and the orchestrator in their environment only: never in argv, a file or a log; and a
fresh vLLM API key (`secrets.API_KEY_ENV`, or the one in `rl`'s environment) handed the same way
to the inference servers and every client of them (orchestrator, env servers). Env servers
(which run model-driven code) get an allow-list of `rl`'s environment (`process.allowed_environ`,
plus the env's `pass_env` and its clients' `api_key_env`) and the API key, never the token. The
trainer runs under torchrun (`envrl.launcher.torchrun`, rendezvous bound to loopback) when it has
more than one rank, and as a plain process with one.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from envrl.data import layout
from envrl.launcher.config import ResolvedRun
from envrl.launcher.cpus import CpuPlan, trainer_env, vllm_is_cpu_build
from envrl.launcher.placement import Placement
from envrl.runtime.process import allowed_environ
from envrl.runtime.secrets import API_KEY_ENV, api_key

TORCHRUN_RANK_ENV = "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
"""What torchrun adds to each rank's environment (the only per-rank difference)."""


class Command(BaseModel):
    name: str
    argv: list[str]
    env: dict[str, str] = {}
    """Variables set on top of `rl`'s environment."""
    secret_env: dict[str, str] = Field({}, exclude=True, repr=False)
    """Variables set like `env` but never shown (`shell`, dumps, reprs): the reload token, the API key."""
    allowed_env: list[str] | None = None
    """None: `rl`'s whole environment; else only `process.allowed_environ` with these names too."""
    log_file: Path
    note: str = ""
    """What the command line alone does not show (torchrun's per-rank variables)."""

    def shell(self) -> str:
        """The command as one shell line, its environment variables first."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in self.env.items()]
        assignments += [f"{key}=<secret>" for key in self.secret_env]
        return " ".join([*assignments, shlex.join(self.argv)])

    def environ(self) -> dict[str, str]:
        """The child's whole environment."""
        inherited = os.environ if self.allowed_env is None else allowed_environ(self.allowed_env)
        return {**inherited, **self.env, **self.secret_env}


class LaunchPlan(BaseModel):
    inference: list[Command]
    """One per inference replica."""
    env_servers: list[Command]
    """In the order of `ResolvedRun.env_servers`."""
    trainer: Command
    orchestrator: Command

    def commands(self) -> list[Command]:
        """Every command, in start order."""
        return [*self.inference, *self.env_servers, self.trainer, self.orchestrator]


def env_server_key(split: str, name: str) -> str:
    return f"envs/{split}/{name}"


def trainer_argv(
    python: str, ranks: int, config: Path, nodes: int = 1, node_rank: int = 0, master: str = "", port: int = 29500
) -> list[str]:
    """The trainer's command: under torchrun with `ranks` > 1 per host (one node: loopback
    rendezvous) or with `nodes` > 1 (this host is `node_rank`, rendezvous on `master`:`port`)."""
    args = ["envrl.trainer.main", "--config", str(config)]
    if ranks == 1 and nodes == 1:
        return [python, "-m", *args]
    torchrun = [python, "-m", "envrl.launcher.torchrun"]
    if nodes == 1:
        # --local-addr: MASTER_ADDR is 127.0.0.1, not this host's name (which may resolve to a public interface)
        torchrun += ["--standalone", "--local-addr", "127.0.0.1"]
    else:
        torchrun += ["--nnodes", str(nodes), "--node-rank", str(node_rank)]
        torchrun += ["--master-addr", master, "--master-port", str(port)]
    torchrun += ["--nproc-per-node", str(ranks)]
    return [*torchrun, "-m", "envrl.runtime.guarded", *args]  # each rank: die with torchrun, then the trainer


def inference_command(name: str, out: Path, env: dict[str, str], secret_env: dict[str, str]) -> Command:
    """Inference replica `name`: its config from `configs/<name>.toml`, its log `logs/<name>.log`."""
    return Command(
        name=name,
        argv=[sys.executable, "-m", "envrl.inference.main", "--config", str(layout.process_config_file(out, name))],
        env=env,
        secret_env=secret_env,
        log_file=layout.process_log_file(out, name),
    )


def launch_plan(run: ResolvedRun, placement: Placement, cpus: CpuPlan | None) -> LaunchPlan:
    """The commands of `run`, with each process's devices and cores in its environment."""
    python = sys.executable
    out = run.trainer.output_dir
    ranks = placement.trainer_ranks
    trainer_vars = {**placement.trainer_env(), **trainer_env(cpus, vllm_is_cpu_build(), run.trainer.max_async_level)}
    if cpus is not None and ranks > 1:  # the ranks share the trainer's cores
        trainer_vars["OMP_NUM_THREADS"] = str(max(1, len(cpus.trainer) // ranks))
    token_env = run.inference.reload.token_env
    token = {token_env: run.inference.reload.token() or secrets.token_urlsafe(32)}
    key = {API_KEY_ENV: api_key() or secrets.token_urlsafe(32)}
    servers = []
    for server in run.env_servers:
        servers.append(
            Command(
                name=server.title,
                argv=server.argv(layout.process_config_file(out, env_server_key(server.split, server.name))),
                secret_env=key,
                allowed_env=server.allowed_env(withheld=frozenset({token_env})),
                log_file=layout.env_log_file(out, server.split, server.name),
            )
        )
    return LaunchPlan(
        inference=[
            inference_command(
                name, out, {**placement.inference_env(i), **(cpus.inference_env() if cpus else {})}, {**token, **key}
            )
            for i, name in enumerate(run.inference_replicas())
        ],
        env_servers=servers,
        trainer=Command(
            name="trainer",
            argv=trainer_argv(python, ranks, layout.process_config_file(out, "trainer")),
            env=trainer_vars,
            log_file=layout.process_log_file(out, "trainer"),
            note=f"torchrun starts {ranks} ranks, each with its own {TORCHRUN_RANK_ENV}" if ranks > 1 else "",
        ),
        orchestrator=Command(
            name="orchestrator",
            argv=[
                python,
                "-m",
                "envrl.orchestrator.main",
                "--config",
                str(layout.process_config_file(out, "orchestrator")),
            ],
            secret_env={**token, **key},
            log_file=layout.process_log_file(out, "orchestrator"),
        ),
    )
