"""The command line, environment and log file of every process `rl` starts: exactly what `--dry-run` prints; secrets
travel only in the environment, and env servers get an allow-list of `rl`'s environment, never the reload token."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from envrl.data import layout
from envrl.runtime.process import allowed_environ

TORCHRUN_RANK_ENV = "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
"""What torchrun adds to each rank's environment (the only per-rank difference)."""


class Command(BaseModel):
    name: str
    argv: list[str]
    env: dict[str, str] = {}
    """Variables set on top of `rl`'s environment."""
    secrets: list[str] = []
    """The run's secrets it gets, by variable name (`RunPlan.secrets`); `shell` shows `NAME=<secret>`."""
    allowed_env: list[str] | None = None
    """None: `rl`'s whole environment; else only `process.allowed_environ` with these names too."""
    log_file: Path
    note: str = ""
    """What the command line alone does not show (torchrun's per-rank variables)."""

    def shell(self) -> str:
        """The command as one shell line, its environment variables first."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in self.env.items()]
        assignments += [f"{key}=<secret>" for key in self.secrets]
        return " ".join([*assignments, shlex.join(self.argv)])

    def environ(self, secrets: Mapping[str, str] = {}) -> dict[str, str]:
        """The child's whole environment, with the values of its `secrets` from `secrets` (the run's)."""
        inherited = os.environ if self.allowed_env is None else allowed_environ(self.allowed_env)
        return {**inherited, **self.env, **{name: secrets[name] for name in self.secrets if name in secrets}}


class RunCommands(BaseModel):
    """Every command of a run, by role (`RunPlan.commands`)."""

    inference: list[Command]
    """One per inference replica."""
    teacher: Command | None = None
    """The distillation teacher's server (`orchestrator.distill.teacher_weights`), or None."""
    env_servers: list[Command]
    """In the order of `RunPlan.env_servers`."""
    trainer: Command
    """The trainer (on several hosts: its first host's part, where rank 0 and the rendezvous are)."""
    trainer_nodes: list[Command] = []
    """The trainer's part on each further host (`rl --slurm` with `slurm.trainer_nodes` > 1)."""
    orchestrator: Command

    def commands(self) -> list[Command]:
        """Every command, servers first, then trainer and orchestrator: the order `rl --slurm`
        starts them in (`rl` itself starts the trainer before the env servers, so it loads while
        they do)."""
        teacher = [self.teacher] if self.teacher is not None else []
        return [*self.inference, *teacher, *self.env_servers, self.trainer, *self.trainer_nodes, self.orchestrator]


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


def process_command(python: str, module: str, name: str, out: Path, **fields: object) -> Command:
    """Process `name` running `module` with its config from `configs/<name>.toml`, its log `logs/<name>.log`."""
    argv = [python, "-m", module, "--config", str(layout.process_config_file(out, name))]
    return Command.model_validate(
        {"name": name, "argv": argv, "log_file": layout.process_log_file(out, name), **fields}
    )
