"""`RLConfig`: one file for a whole run, the user's keys only (never a value derived from another section); the keys
`rl` sets itself in a process's section are `owned_keys`, out of `--help` and refused when given."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field, model_validator

from envrl.config import BaseConfig, RunKeys
from envrl.inference.config import InferenceConfig
from envrl.launcher.log_rotation import LogRotationConfig
from envrl.launcher.plan.cpus import CpusConfig
from envrl.launcher.plan.placement import PlacementConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.restarts import RestartPolicy
from envrl.telemetry.log import LogConfig
from envrl.telemetry.metrics import WandbConfig
from envrl.trainer.config import TrainerConfig

SHARED_KEYS = (*RunKeys.model_fields, "seed", "wandb", "log")
SET_BY_RL = {
    "trainer.resume": "--resume",
    "orchestrator.resume": "--resume",
    "orchestrator.inference": "the inference servers it starts (inference.port, placement.inference.replicas, "
    "inference.reload.token_env, inference.ready_timeout_s)",
    "orchestrator.restarts": "restarts (every env server rl starts follows it)",
    "orchestrator.eval.addresses": "env_server_base_port (eval env i's server binds base + 1000 + i)",
    "log.file": "output_dir (every process logs to <output_dir>/logs/<process>.log)",
    "trainer.weights.host": "the hosts it places the trainer on (loopback: its replicas run beside the trainer; "
    "rl --slurm: the trainer's first host)",
}
"""Keys that `rl` sets from its own keys (beyond the shared ones), in a process's section or its own."""
EVAL_PORT_OFFSET = 1000


class RunRestarts(RestartPolicy):
    """How `rl` restarts each of its own processes when it dies, without user action: an inference
    replica (on its port, with the newest policy), the trainer (from its newest checkpoint) and the
    orchestrator (after its newest published batch) and every env server (on its address), each
    with a budget of its own of this shape. A process whose budget is spent ends the run;
    `--resume` goes on. The window and the first backoff are fixed."""

    window_s: ClassVar[float] = RestartPolicy.model_fields["window_s"].default
    backoff_s: ClassVar[float] = RestartPolicy.model_fields["backoff_s"].default


class SlurmConfig(BaseConfig):
    """Where the roles go when `rl --slurm` writes a SLURM batch script (launcher/slurm.py): host i
    is the i-th host of the job's node list. Read by `rl --slurm` only."""

    nodes: int = Field(2, ge=1)
    """Hosts of the job (`#SBATCH --nodes`)."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs asked for on each host (`#SBATCH --gpus-per-node`; 0: none, a CPU job)."""
    trainer_nodes: int = Field(1, ge=1)
    """The first this many hosts run the trainer: torchrun on each, one rank per device of
    `placement.trainer.gpus` (else `placement.trainer.num_procs` ranks), rendezvous on host 0."""
    inference_nodes: int = Field(1, ge=1)
    """The last this many hosts each run `placement.inference.replicas` servers on `placement.inference.gpus`."""
    env_node: int = -1
    """The host of the env servers (an index; negative counts from the end). Off host 0, where
    the orchestrator runs, they serve over CURVE with keys the job makes in the run directory."""
    rendezvous_port: ClassVar[int] = 29500
    """torchrun's rendezvous port on host 0 (fixed, torchrun's own default: a job's hosts are its own)."""
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


class RLConfig(RunKeys):
    output_dir_group: str | None = None
    """A group that may read the run directory (mode 0750, that group, set-group-id so what the run
    writes stays in it); default: nobody but its owner."""
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
    shutdown_grace_s: ClassVar[float] = 15.0
    """Seconds each process gets to exit after SIGTERM before it is killed (fixed)."""
    report: bool = True
    """Write the report (`<output_dir>/report/`) when the run ends; `--no-report` leaves it out (and
    its seconds of plotting), and `rl report OUTPUT_DIR` writes it at any time."""
    log: LogConfig = LogConfig()
    """Every process's log level (each one's output goes to `<output_dir>/logs/`)."""
    log_rotation: ClassVar[LogRotationConfig] = LogRotationConfig()
    """Every process's log under `logs/` is rotated past `max_mb`, `keep` older copies kept (fixed)."""
    placement: PlacementConfig = PlacementConfig()
    """Devices of each role and how many of each process `rl` starts (docs/gpu.md)."""
    cpus: CpusConfig = CpusConfig()
    slurm: SlurmConfig = SlurmConfig()
    """Host placement of `rl --slurm`'s batch script (several hosts)."""
    trainer: TrainerConfig = TrainerConfig()
    orchestrator: OrchestratorConfig
    inference: InferenceConfig = InferenceConfig()

    help_keys: ClassVar[tuple[str, ...]] = (
        "model.name", "output_dir", "max_steps", "max_async_level", "seed", "resume", "clean", "report",
        "wandb.mode", "wandb.project", "wandb.name", "placement", "trainer.optim.lr", "trainer.lora",
        "orchestrator.envs", "orchestrator.batch_size", "orchestrator.group_size", "orchestrator.sampling.max_tokens",
        "orchestrator.sampling.temperature", "orchestrator.refill_rollouts", "orchestrator.eval", "inference.vllm",
    )  # fmt: skip
    """The keys people change (docs/config.md's table): `rl --help` lists these, `rl --help-all` every key."""
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


def set_by_user(config: BaseModel, dotted: str) -> bool:
    """Whether the user's config gave `dotted` (every section on its path given, and the key)."""
    *path, key = dotted.split(".")
    for name in path:
        if name not in config.model_fields_set:
            return False
        config = getattr(config, name)
    return key in config.model_fields_set
