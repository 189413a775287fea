"""`plan(rl, hosts, machine)`: the only place values flow between an `RLConfig`'s sections, pure (no file, socket,
process or variable touched); `rl`, `--dry-run` and `--slurm` execute or print the same plan."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from envrl.config import ConfigError
from envrl.data import layout
from envrl.inference.config import InferenceConfig, lora_serving_options
from envrl.launcher.config import SET_BY_RL, SHARED_KEYS, RLConfig, set_by_user
from envrl.launcher.plan.checks import check_lengths, check_no_shared_port, external_ports, off_policy_problem
from envrl.launcher.plan.commands import (
    TORCHRUN_RANK_ENV,
    Command,
    RunCommands,
    process_command,
    trainer_argv,
)
from envrl.launcher.plan.cpus import CoreSplit, split_cores, trainer_env, usable_cores, vllm_is_cpu_build
from envrl.launcher.plan.env_servers import env_servers
from envrl.launcher.plan.placement import Placement, place, visible_gpus
from envrl.launcher.plan.replicas import replica_configs, replica_name
from envrl.launcher.plan.teacher import plan_teacher
from envrl.launcher.run_keys import Secret
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.net import is_loopback_host
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.secrets import API_KEY_ENV
from envrl.serve.launch import EnvServerLaunch
from envrl.trainer.config import TrainerConfig
from envrl.transport.config import MEMORY_WITH_RESTARTS

LOCAL_HOST = "127.0.0.1"
"""The one host of a run on this machine: its env servers and trainer rank 0 listen there."""
TEACHER = "teacher"
"""The process name of the distillation teacher's server `rl` starts (its config and log)."""


class Machine(BaseModel):
    """What `plan` knows of the machine `rl` runs on; read by `Machine.here`, never by `plan`."""

    visible_gpus: list[str] | None = None
    """The GPUs `rl` may hand out (`placement.visible_gpus`); None: unknown, ids are taken as given."""
    cores: list[int] = []
    """The cores `rl` may use."""
    cpu_vllm: bool = False
    """Whether the installed vLLM is the CPU build."""
    omp_threads_set: bool = False
    """Whether `rl`'s environment sets OMP_NUM_THREADS (then the trainer keeps it)."""

    @classmethod
    def here(cls) -> Machine:
        return cls(
            visible_gpus=visible_gpus(),
            cores=sorted(usable_cores()),
            cpu_vllm=vllm_is_cpu_build(),
            omp_threads_set="OMP_NUM_THREADS" in os.environ,
        )


@dataclass(frozen=True)
class RunPlan:
    """Every process of a run: its config, its host and its command; and what to make first.
    (A dataclass: the configs it holds are the plan's own, not validated again, e.g. for a host
    whose reload token only the job's environment will hold.)"""

    hosts: list[str]
    """Host i of the run: `[LOCAL_HOST]` on this machine, the job's hosts in node order under `rl --slurm`."""
    trainer: TrainerConfig
    orchestrator: OrchestratorConfig
    inference: InferenceConfig
    """The run's inference options (each replica's own config: `replicas`)."""
    replicas: dict[str, InferenceConfig]
    """Each inference replica's config, by name (`configs/<name>.toml`)."""
    teacher: InferenceConfig | None
    """The distillation teacher's server `rl` starts (`orchestrator.distill.teacher_weights`), or None."""
    env_servers: list[EnvServerLaunch]
    """The env servers `rl` starts: train envs, then eval tables, each without an `address`."""
    commands: RunCommands
    host_of: dict[str, int]
    """The index in `hosts` of each command, by command name."""
    placement: Placement
    cpus: CoreSplit | None
    secrets: list[Secret]
    """Environment secrets the launcher makes before it starts anything (`run_keys.make_secrets`)."""
    curve_dir: Path
    """Where the launcher makes the CURVE keys the env servers and the orchestrator name (`make_curve_keys`)."""
    warnings: list[str]
    """What the run may start with but should not (`check: ...`); the launcher logs each."""

    @property
    def output_dir(self) -> Path:
        return self.trainer.output_dir

    def configs(self) -> dict[str, BaseModel]:
        """Each process's config by name (`configs/<name>.toml` in the run directory)."""
        configs: dict[str, BaseModel] = {**self.replicas, "trainer": self.trainer, "orchestrator": self.orchestrator}
        if self.teacher is not None:
            configs[TEACHER] = self.teacher
        for server in self.env_servers:
            configs[layout.env_server_process(server.split, server.name)] = server.config
        return configs

    def start_order(self) -> list[tuple[int, Command]]:
        """(host index, command) of every process in start order: servers, then trainer and orchestrator."""
        return [(self.host_of[command.name], command) for command in self.commands.commands()]

    def on_host(self, index: int) -> list[Command]:
        return [command for host, command in self.start_order() if host == index]

    def spawned_ports(self) -> list[tuple[str, int, str]]:
        """(host, port, who) of every server the launcher starts: inference replicas, the teacher, then env servers."""
        ports = [(config.host, config.port, name) for name, config in self.replicas.items()]
        if self.teacher is not None:
            ports.append((self.teacher.host, self.teacher.port, "the teacher (orchestrator.distill.teacher_port)"))
        for server in self.env_servers:
            parts = urlsplit(server.config.address)
            ports.append((parts.hostname or LOCAL_HOST, parts.port or 0, f"{server.split} env {server.name!r}"))
        return ports


@dataclass(frozen=True)
class _Hosts:
    """Which host runs what: indices into `names`."""

    names: list[str]
    inference: list[int]
    """One per inference host; each runs `placement.inference.replicas` servers."""
    trainer: list[int]
    env: int
    job: bool

    @property
    def head(self) -> str:
        """Where the orchestrator and trainer rank 0 run."""
        return self.names[0]

    @property
    def teacher(self) -> int:
        """Where a distillation teacher's server runs: the first inference host."""
        return self.inference[0]

    @property
    def apart(self) -> set[frozenset[str]]:
        """The pairs of roles (`placement.ROLE_KEYS`) that share no host, so their devices may overlap."""
        hosts = {"trainer": set(self.trainer), "inference": set(self.inference), "teacher": {self.teacher}}
        return {frozenset((a, b)) for (a, x), (b, y) in itertools.combinations(hosts.items(), 2) if not x & y}


def _hosts(rl: RLConfig, hosts: Sequence[str] | None) -> _Hosts:
    if hosts is None:
        return _Hosts([LOCAL_HOST], inference=[0], trainer=[0], env=0, job=False)
    slurm = rl.slurm
    if len(hosts) != slurm.nodes:
        raise ConfigError(f"{len(hosts)} hosts given for a job of slurm.nodes = {slurm.nodes}")
    inference = list(range(slurm.nodes - slurm.inference_nodes, slurm.nodes))
    return _Hosts(list(hosts), inference, list(range(slurm.trainer_nodes)), slurm.env_node % slurm.nodes, job=True)


def plan(rl: RLConfig, hosts: Sequence[str] | None = None, machine: Machine | None = None) -> RunPlan:
    """The run of `rl` on this machine (`hosts` None) or on a job's `hosts` (module docstring);
    `machine` (default: nothing known) is what `rl` found of the machine it runs on."""
    machine = machine or Machine()
    where = _hosts(rl, hosts)
    trainer, orchestrator, inference = _sections(rl, where.head)
    replicas = _replicas(rl, inference, where)
    urls = [config.base_url for config in replicas.values()]
    orchestrator, servers = env_servers(rl, _with_inference(orchestrator, inference, urls), where.names[where.env])
    placement = place(rl.placement, inference.vllm, None if where.job else machine.visible_gpus, where.apart)
    base = _shared(rl, "inference")  # the run's options before _sections added the policy's LoRA serving
    assert isinstance(base, InferenceConfig)
    teacher_host = where.names[where.teacher] if where.job else base.host
    neighbours = [role for role in ("trainer", "inference") if frozenset((role, "teacher")) not in where.apart]
    orchestrator, teacher = plan_teacher(orchestrator, base, teacher_host, placement, neighbours, where.job)
    cpus = None if where.job else split_cores(rl.cpus, set(machine.cores), machine.cpu_vllm)
    commands, host_of = _commands(rl, replicas, teacher, servers, where, placement, cpus, machine)
    warnings = []
    if problem := off_policy_problem(rl.max_async_level, trainer.loss.clip, trainer.loss.ratio_mask):
        if orchestrator.checks.strict:
            raise ConfigError(f"{problem} (orchestrator.checks.strict)")
        warnings.append(f"check: {problem}")
    run = RunPlan(
        hosts=where.names, trainer=trainer, orchestrator=orchestrator, inference=inference, replicas=replicas,
        teacher=teacher, env_servers=servers, commands=commands, host_of=host_of, placement=placement, cpus=cpus,
        secrets=[
            Secret(name=inference.reload.token_env, what="/update_weights token: inference and orchestrator only"),
            Secret(name=API_KEY_ENV, what="vLLM's API key: the inference servers and every client of them"),
        ],
        curve_dir=layout.curve_dir(rl.output_dir), warnings=warnings,
    )  # fmt: skip
    check_no_shared_port([*run.spawned_ports(), *external_ports(rl.orchestrator)])
    check_lengths(trainer, orchestrator, inference)
    return run


def _sections(rl: RLConfig, head: str) -> tuple[TrainerConfig, OrchestratorConfig, InferenceConfig]:
    """Each process's section with the shared keys and the values `rl` sets from its own keys."""
    trainer, orchestrator, inference = (_shared(rl, name) for name in ("trainer", "orchestrator", "inference"))
    for dotted, source in SET_BY_RL.items():
        if set_by_user(rl, dotted):
            raise ConfigError(f"'{dotted}' is set by rl from {source}: remove it from the config")
    assert isinstance(trainer, TrainerConfig) and isinstance(orchestrator, OrchestratorConfig)
    assert isinstance(inference, InferenceConfig)
    if trainer.weights.transport == "memory" and rl.restarts.max_restarts > 0:  # issue 37, item 8
        raise ConfigError(MEMORY_WITH_RESTARTS)
    # the memory transport: the replicas reach trainer rank 0 on the run's first host
    weights = trainer.weights.model_copy(update={"host": head})
    trainer = trainer.model_copy(update={"resume": rl.resume, "weights": weights})
    if trainer.lora is not None:  # the server hot-loads each step's adapter (inference.vllm wins)
        inference = inference.model_copy(update={"vllm": {**lora_serving_options(trainer.lora.rank), **inference.vllm}})
    derived = {
        "resume": rl.resume,
        "max_inflight": orchestrator.inflight_limit,  # derived from the run's max_async_level
        "restarts": RestartPolicy.model_validate(rl.restarts.model_dump()),  # the env servers' too
    }
    if "keep_weights_every" not in orchestrator.model_fields_set:  # loadable policies at every checkpoint
        derived["keep_weights_every"] = trainer.ckpt.interval
    return trainer, orchestrator.model_copy(update=derived), inference


def _shared(rl: RLConfig, name: str) -> BaseModel:
    """Section `name` of `rl` (a deep copy) with the top-level shared keys it has."""
    section: BaseModel = getattr(rl, name)
    for key in section.model_fields_set & set(SHARED_KEYS):
        raise ConfigError(f"'{name}.{key}' is shared by every process: set '{key}' at the top level instead")
    updates = {key: getattr(rl, key) for key in SHARED_KEYS if key in type(section).model_fields}
    return section.model_copy(update=updates, deep=True)


def _replicas(rl: RLConfig, inference: InferenceConfig, where: _Hosts) -> dict[str, InferenceConfig]:
    """Each inference replica's config: `replicas` per inference host, on ports from `inference.port`."""
    count = rl.placement.inference.replicas
    out: dict[str, InferenceConfig] = {}
    for n, index in enumerate(where.inference):
        host = where.names[index] if where.job else inference.host
        allow_remote = inference.reload.allow_remote or not is_loopback_host(host)  # the token guards it
        node = inference.model_copy(
            update={"host": host, "reload": inference.reload.model_copy(update={"allow_remote": allow_remote})}
        )
        for i, config in enumerate(replica_configs(node, count).values()):
            out[replica_name(n * count + i, count * len(where.inference))] = config
    return out


def _with_inference(
    orchestrator: OrchestratorConfig, inference: InferenceConfig, urls: list[str]
) -> OrchestratorConfig:
    """The orchestrator as a client of the run's inference replicas at `urls`."""
    client = orchestrator.inference.model_copy(
        update={
            "base_url": urls[0] if len(urls) == 1 else urls,
            "reload_token_env": inference.reload.token_env,
            "ready_timeout_s": inference.ready_timeout_s,  # the orchestrator waits as long
        }
    )
    return orchestrator.model_copy(update={"inference": client})


def _commands(
    rl: RLConfig,
    replicas: dict[str, InferenceConfig],
    teacher: InferenceConfig | None,
    servers: list[EnvServerLaunch],
    where: _Hosts,
    placement: Placement,
    cpus: CoreSplit | None,
    machine: Machine,
) -> tuple[RunCommands, dict[str, int]]:
    """Each process's command with its devices and cores in its environment, and its host."""
    python, out = sys.executable, rl.output_dir
    token, key = rl.inference.reload.token_env, API_KEY_ENV
    per_host = rl.placement.inference.replicas
    inference = [
        process_command(
            python, "envrl.inference.main", name, out, secrets=[token, key],
            env={**placement.inference_env(i % per_host), **(cpus.inference_env() if cpus else {})},
        )
        for i, name in enumerate(replicas)
    ]  # fmt: skip
    teacher_command = None
    if teacher is not None:  # on the inference cores: it scores the step's samples while vLLM idles
        teacher_command = process_command(
            python, "envrl.inference.main", TEACHER, out, secrets=[token, key],
            env={**placement.teacher_env(), **(cpus.inference_env() if cpus else {})},
        )  # fmt: skip
    env_servers = [
        Command(
            name=server.title,
            argv=server.argv(server.config_file(out)),
            secrets=[key],
            allowed_env=server.allowed_env(withheld=frozenset({token})),
            log_file=layout.env_log_file(out, server.split, server.name),
        )
        for server in servers
    ]
    trainers = _trainer_commands(rl, where, placement, cpus, machine)
    orchestrator = process_command(python, "envrl.orchestrator.main", "orchestrator", out, secrets=[token, key])
    host_of = {command.name: where.inference[i // per_host] for i, command in enumerate(inference)}
    host_of |= {command.name: where.env for command in env_servers}
    host_of |= {command.name: where.trainer[rank] for rank, command in enumerate(trainers)}
    host_of[orchestrator.name] = 0
    if teacher_command is not None:
        host_of[teacher_command.name] = where.teacher
    launch = RunCommands(
        inference=inference, teacher=teacher_command, env_servers=env_servers, trainer=trainers[0], trainer_nodes=trainers[1:],
        orchestrator=orchestrator,
    )  # fmt: skip
    return launch, host_of


def _trainer_commands(
    rl: RLConfig, where: _Hosts, placement: Placement, cpus: CoreSplit | None, machine: Machine
) -> list[Command]:
    """The trainer's command on each of its hosts (rank 0's host first: the rendezvous)."""
    ranks, nodes, out = placement.trainer_ranks, len(where.trainer), rl.output_dir
    env = {
        **placement.trainer_env(),
        **trainer_env(cpus, machine.cpu_vllm, rl.max_async_level, len(machine.cores), machine.omp_threads_set),
    }
    if cpus is not None and ranks > 1:  # the ranks share the trainer's cores
        env["OMP_NUM_THREADS"] = str(max(1, len(cpus.trainer) // ranks))
    config = layout.process_config_file(out, "trainer")
    commands = []
    for rank in range(nodes):
        name = "trainer" if rank == 0 else f"trainer-node{rank}"
        argv = trainer_argv(sys.executable, ranks, config, nodes, rank, where.head, rl.slurm.rendezvous_port)
        note = f"torchrun starts {ranks} ranks, each with its own {TORCHRUN_RANK_ENV}" if ranks > 1 else ""
        commands.append(Command(name=name, argv=argv, env=env, log_file=layout.process_log_file(out, name), note=note))
    return commands
