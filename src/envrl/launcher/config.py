"""`RLConfig`: one file for a whole run, resolved ONCE into each process's own complete config.

Guarantee: `resolve_run` is the only place where values flow between sections: shared keys
(model, output_dir, max_steps, max_async_level, seed, wandb, log) are copied from the top level
into every section, env servers get their fixed ports and log files (and the run's CURVE keys:
they admit only the run's orchestrator, on loopback too), and every process gets the addresses
of the others. (Log files are not in the configs: the launcher sends each process's output to
`<output_dir>/logs/`.) A shared key set inside a section is an error, so nobody has to
guess which of two values wins; so are two processes of the run on one TCP port.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from loguru import logger
from pydantic import BaseModel, Field, model_validator

from envrl.config import BaseConfig, ConfigError, ModelConfig
from envrl.data import layout
from envrl.inference.adapter import lora_serving_options
from envrl.inference.config import InferenceConfig
from envrl.launcher.cpus import CpusConfig
from envrl.launcher.log_rotation import LogRotationConfig
from envrl.launcher.replicas import replica_configs
from envrl.launcher.run_keys import curve_keys
from envrl.model.client import ChatClientConfig
from envrl.orchestrator.checks import off_policy_problem
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.net import is_loopback_host
from envrl.runtime.process import RestartPolicy
from envrl.runtime.secrets import API_KEY_ENV
from envrl.serve.config import ModelAccessConfig
from envrl.serve.launch import EnvServerLaunch
from envrl.telemetry.log import LogConfig
from envrl.telemetry.metrics import WandbConfig
from envrl.trainer.config import TrainerConfig
from envrl.transport.config import MEMORY_WITH_RESTARTS

SHARED_KEYS = ("model", "output_dir", "max_steps", "max_async_level", "seed", "wandb", "log")
SET_BY_RL = {
    "trainer.resume": "--resume",
    "orchestrator.resume": "--resume",
    "orchestrator.inference": "the inference servers it starts (inference.port, replicas, reload.token_env, "
    "ready_timeout_s)",
    "orchestrator.restarts": "restarts (every env server rl starts follows it)",
    "orchestrator.eval.addresses": "env_server_base_port (eval env i's server binds base + 1000 + i)",
    "log.file": "output_dir (every process logs to <output_dir>/logs/<process>.log)",
    "trainer.weights.host": "the hosts it places the trainer on (loopback: its replicas run beside the trainer; "
    "rl --slurm: the trainer's first host)",
}
"""Keys that `rl` sets from its own keys (beyond the shared ones), in a process's section or its own."""
EVAL_PORT_OFFSET = 1000
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class RunRestarts(RestartPolicy):
    """How `rl` restarts each of its own processes when it dies, without user action: an inference
    replica (on its port, with the newest policy), the trainer (from its newest checkpoint) and the
    orchestrator (after its newest published batch) and every env server (on its address), each
    with a budget of its own of this shape. A process whose budget is spent ends the run;
    `--resume` goes on."""

    removed_keys: ClassVar[dict[str, str]] = {
        role: "one policy for every process rl starts, each with its own budget: set restarts.max_restarts, "
        "window_s, backoff_s, max_backoff_s"
        for role in ("inference", "trainer", "orchestrator")
    }


class SlurmConfig(BaseConfig):
    """Where the roles go when `rl --slurm` writes a SLURM batch script (launcher/slurm.py): host i
    is the i-th host of the job's node list. Read by `rl --slurm` only."""

    nodes: int = Field(2, ge=1)
    """Hosts of the job (`#SBATCH --nodes`)."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs asked for on each host (`#SBATCH --gpus-per-node`; 0: none, a CPU job)."""
    trainer_nodes: int = Field(1, ge=1)
    """The first this many hosts run the trainer: torchrun on each, one rank per device of
    `trainer.gpus` (else `trainer.num_procs` ranks), rendezvous on host 0."""
    inference_nodes: int = Field(1, ge=1)
    """The last this many hosts each run `inference.replicas` servers on `inference.gpus`."""
    env_node: int = -1
    """The host of the env servers (an index; negative counts from the end). Off host 0, where
    the orchestrator runs, they serve over CURVE with keys the job makes in the run directory."""
    rendezvous_port: int = Field(29500, ge=1, le=65535)
    """torchrun's rendezvous port on host 0."""
    sbatch: list[str] = []
    """More `#SBATCH` options, as given: `["--partition=gpu", "--time=24:00:00"]`."""

    @model_validator(mode="after")
    def _fits(self) -> SlurmConfig:
        for key in ("trainer_nodes", "inference_nodes"):
            if getattr(self, key) > self.nodes:
                raise ValueError(f"{key} = {getattr(self, key)} is more than nodes = {self.nodes}")
        if not -self.nodes <= self.env_node < self.nodes:
            raise ValueError(f"env_node = {self.env_node} names no host of {self.nodes}")
        return self


class RLConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    output_dir: Path = Path("outputs/rl")
    """Run directory: logs/, configs/, rollouts/, weights/, checkpoints/, metrics.jsonl. Private to
    its owner (mode 0700) unless `output_dir_group` names a group that may read it."""
    output_dir_group: str | None = None
    """A group that may read the run directory (mode 0750, that group, set-group-id so what the run
    writes stays in it); default: nobody but its owner."""
    max_steps: int = Field(20, ge=1)
    """Training steps: the trainer takes one optimizer step per published batch."""
    max_async_level: int = Field(1, ge=0)
    """Batch n may be generated by any policy >= n - max_async_level (0: fully on-policy)."""
    seed: int = 0
    """Seed of task order, sampling seeds and model init: a run is reproducible from it."""
    wandb: WandbConfig = WandbConfig()
    env_server_base_port: int = Field(5000, ge=1, le=65535 - EVAL_PORT_OFFSET - 100)
    """Train env i binds base + i, the env of eval table i binds base + 1000 + i (envs with `address`
    excepted)."""
    resume: bool = False
    """Continue the run in `output_dir` from its last checkpoint and orchestrator state."""
    clean: bool = False
    """Start over: delete the earlier run in `output_dir` (only what rl wrote there; a directory rl
    did not create is refused)."""
    restarts: RunRestarts = RunRestarts()
    shutdown_grace_s: float = Field(15.0, gt=0)
    """Seconds each process gets to exit after SIGTERM before it is killed."""
    log: LogConfig = LogConfig()
    """Every process's log level (each one's output goes to `<output_dir>/logs/`)."""
    log_rotation: LogRotationConfig = LogRotationConfig()
    """Every process's log under `logs/` is rotated past `max_mb`, `keep` older copies kept."""
    cpus: CpusConfig = CpusConfig()
    slurm: SlurmConfig = SlurmConfig()
    """Host placement of `rl --slurm`'s batch script (several hosts)."""
    trainer: TrainerConfig = TrainerConfig()
    orchestrator: OrchestratorConfig
    inference: InferenceConfig = InferenceConfig()

    owned_keys: ClassVar[frozenset[str]] = frozenset(
        [
            f"{name}.{key}"
            for name, section in (
                ("trainer", TrainerConfig),
                ("orchestrator", OrchestratorConfig),
                ("inference", InferenceConfig),
            )
            for key in SHARED_KEYS
            if key in section.model_fields
        ]
        + list(SET_BY_RL)
    )

    renamed_keys: ClassVar[dict[str, str]] = {"shutdown_grace": "shutdown_grace_s"}


class ResolvedRun(BaseModel):
    trainer: TrainerConfig
    orchestrator: OrchestratorConfig
    inference: InferenceConfig
    env_servers: list[EnvServerLaunch]

    def inference_replicas(self) -> dict[str, InferenceConfig]:
        """Each inference replica's own config, by name (launcher/replicas.py)."""
        return replica_configs(self.inference)

    def spawned_ports(self) -> list[tuple[str, int, str]]:
        """(host, port, who) of every server the launcher starts: inference replicas, then env servers."""
        ports = [(config.host, config.port, name) for name, config in self.inference_replicas().items()]
        for server in self.env_servers:
            parts = urlsplit(server.config.address)
            ports.append((parts.hostname or "127.0.0.1", parts.port or 0, f"{server.split} env {server.name!r}"))
        return ports


def resolve_run(rl: RLConfig) -> ResolvedRun:
    """Each process's complete config for this run (see the module docstring)."""
    sections = {"trainer": rl.trainer, "orchestrator": rl.orchestrator, "inference": rl.inference}
    shared = {key: getattr(rl, key) for key in SHARED_KEYS}
    resolved: dict[str, BaseConfig] = {}
    for name, section in sections.items():
        for key in section.model_fields_set & set(shared):
            raise ConfigError(f"'{name}.{key}' is shared by every process: set '{key}' at the top level instead")
        updates = {key: value for key, value in shared.items() if key in type(section).model_fields}
        resolved[name] = section.model_copy(update=updates, deep=True)
    for dotted, source in SET_BY_RL.items():
        if _was_set(rl, dotted):
            raise ConfigError(f"'{dotted}' is set by rl from {source}: remove it from the config")

    trainer = resolved["trainer"]
    orchestrator = resolved["orchestrator"]
    inference = resolved["inference"]
    assert isinstance(trainer, TrainerConfig) and isinstance(orchestrator, OrchestratorConfig)
    assert isinstance(inference, InferenceConfig)
    trainer.resume = orchestrator.resume = rl.resume
    if trainer.weights.transport == "memory" and rl.restarts.max_restarts > 0:  # issue 37, item 8
        raise ConfigError(MEMORY_WITH_RESTARTS)
    trainer.weights.host = "127.0.0.1"  # rl's replicas share the trainer's host (rl --slurm sets its first host)
    if trainer.lora is not None:  # the server hot-loads each step's adapter (inference.vllm wins)
        inference.vllm = {**lora_serving_options(trainer.lora.rank), **inference.vllm}
    if "keep_weights_every" not in orchestrator.model_fields_set:  # loadable policies at every checkpoint
        orchestrator.keep_weights_every = trainer.ckpt.interval
    orchestrator.max_inflight = orchestrator.inflight_limit  # derived from the run's max_async_level
    orchestrator.restarts = RestartPolicy.model_validate(rl.restarts.model_dump())  # the env servers' too
    replica_configs(inference)  # a replica port past 65535 is a config error now, not at spawn
    orchestrator.inference.base_url = inference.base_url if inference.replicas == 1 else inference.base_urls
    orchestrator.inference.reload_token_env = inference.reload.token_env
    orchestrator.inference.ready_timeout_s = inference.ready_timeout_s  # the orchestrator waits as long

    servers: list[EnvServerLaunch] = []
    external: list[tuple[str, int, str]] = []
    access = ModelAccessConfig(base_urls=orchestrator.inference.base_urls, tokenizers=[orchestrator.model.name])
    listed: set[str] = set()
    server_keys, client_keys = curve_keys(layout.curve_dir(trainer.output_dir))
    declared = {env.resolved_name: env for env in orchestrator.envs}
    evals = orchestrator.eval_envs()  # before the train envs get their spawned servers' addresses
    for split, envs, base in (
        ("train", orchestrator.train_envs, rl.env_server_base_port),
        ("eval", evals, rl.env_server_base_port + EVAL_PORT_OFFSET),
    ):
        for i, env in enumerate(envs):
            if env.address is not None:  # an external server, of this env's train and eval rollouts
                parts = urlsplit(env.address)
                if parts.scheme == "tcp" and parts.port is not None and env.address not in listed:
                    listed.add(env.address)
                    external.append(
                        (parts.hostname or "", parts.port, f"{split} env {env.resolved_name!r} (its address)")
                    )
                continue
            env.address = f"tcp://127.0.0.1:{base + i}"
            if split == "eval":
                orchestrator.eval.addresses[env.resolved_name] = env.address
            declared[env.resolved_name].curve = client_keys  # the run's own servers admit only its orchestrator
            for client in (env.client, declared[env.resolved_name].client):  # an eval env's is a copy
                _send_run_key(client, orchestrator.inference.base_urls)
            # An env with its own client (a chat teacher, say) may use that client and nothing else.
            allowed = access if env.own_client is None else ModelAccessConfig.for_client(env.own_client)
            servers.append(env.server_launch(split, env.address, allowed, orchestrator.restarts, server_keys))
    run = ResolvedRun(trainer=trainer, orchestrator=orchestrator, inference=inference, env_servers=servers)
    _check_no_shared_port([*run.spawned_ports(), *external])
    _check_lengths(run)
    if problem := off_policy_problem(rl.max_async_level, trainer.loss.clip, trainer.loss.ratio_mask):
        if orchestrator.checks.strict:
            raise ConfigError(f"{problem} (orchestrator.checks.strict)")
        logger.warning(f"check: {problem}")
    return run


def _send_run_key(client: ChatClientConfig | None, run_urls: list[str]) -> None:
    """A chat client of the run's own inference server sends the run's API key (`rl` makes one per
    run) unless it names a key variable itself."""
    if client is None or client.api_key_env is not None:
        return
    if urlsplit(client.base_url).netloc in {urlsplit(url).netloc for url in run_urls}:
        client.api_key_env = API_KEY_ENV


def _check_lengths(run: ResolvedRun) -> None:
    """Token budgets that cannot work together: a turn longer than the model's context, a
    training sample longer than the trainer's micro-batch budget."""
    orchestrator, trainer = run.orchestrator, run.trainer
    context = run.inference.vllm.get("max_model_len")
    # an eval env's max_tokens is its declaration's unless its table sets one
    tables = [("orchestrator.envs", i, env, env) for i, env in enumerate(orchestrator.envs)]
    tables += [
        ("orchestrator.eval.env", i, table, env)
        for i, (table, env) in enumerate(zip(orchestrator.eval.env, orchestrator.eval_envs(), strict=True))
        if "max_tokens" in table.sampling
    ]
    for key, i, table, env in tables:
        max_tokens = env.sampling_args(orchestrator.sampling).max_tokens
        if isinstance(context, int) and max_tokens >= context:
            where = (
                f"{key}[{i}].sampling.max_tokens"
                if "max_tokens" in table.sampling
                else "orchestrator.sampling.max_tokens"
            )
            raise ConfigError(
                f"{where} = {max_tokens} leaves no room for a prompt in inference.vllm.max_model_len = {context}"
            )
    if orchestrator.seq_len is not None and orchestrator.seq_len > trainer.micro_batch_tokens:
        raise ConfigError(
            f"orchestrator.seq_len = {orchestrator.seq_len} is over trainer.micro_batch_tokens = "
            f"{trainer.micro_batch_tokens}, the tokens of one micro-batch: lower seq_len or raise "
            "trainer.micro_batch_tokens"
        )


def _check_no_shared_port(users: list[tuple[str, int, str]]) -> None:
    """Two processes of the run on one port: one would fail to bind, or talk to the wrong server."""
    for i, (host, port, who) in enumerate(users):
        for other_host, other_port, other in users[:i]:
            if port == other_port and _same_host(host, other_host):
                raise ConfigError(
                    f"{other} and {who} would both use port {port}: change env_server_base_port, "
                    "inference.port or the env's address"
                )


def _was_set(config: BaseModel, dotted: str) -> bool:
    """Whether the user's config gave `dotted` (every section on its path given, and the key)."""
    *path, key = dotted.split(".")
    for name in path:
        if name not in config.model_fields_set:
            return False
        config = getattr(config, name)
    return key in config.model_fields_set


def _same_host(a: str, b: str) -> bool:
    """Whether binds on `a` and `b` can collide (a wildcard bind takes the port on every interface)."""
    if a in WILDCARD_HOSTS or b in WILDCARD_HOSTS:
        return True
    return a == b or (is_loopback_host(a) and is_loopback_host(b) and "localhost" in (a, b))
