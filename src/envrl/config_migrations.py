"""Every renamed, moved or removed config key in one table: warned once and moved until its `removed_in` version,
then refused in ONE line naming the new key or what took its place (history: docs/CHANGELOG.md)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


@dataclass(frozen=True)
class Migration:
    model: str
    """Class name of the config model the key belongs to (a root, or a table nested anywhere)."""
    old: str
    """The former key, dotted, relative to `model`."""
    new: str | None
    """The key that replaced it, dotted, relative to `model`; None: removed, `note` says what took its place."""
    removed_in: str
    """The version from which the old key is refused; before it, it warns and still works."""
    note: str = ""

    def warning(self, source: str | None, key: str | None = None) -> str:
        """The one line the old key warns with while it still works (`source`: where it was set; `key`:
        its whole dotted path, when its model is a table inside the config)."""
        where = f" (from {source})" if source else ""
        key = key or self.old
        if self.new is None:
            return f"config key '{key}'{where} is ignored: {self.note}; from envrl {self.removed_in} it is an error"
        new = key.removesuffix(self.old) + self.new
        return (
            f"config key '{key}'{where} is now '{new}': rename it; from envrl {self.removed_in} the old key is an error"
        )


def _renamed(model: str, removed_in: str, pairs: dict[str, str]) -> list[Migration]:
    return [Migration(model, old, new, removed_in) for old, new in pairs.items()]


def _removed(model: str, removed_in: str, keys: Iterable[str], note: str) -> list[Migration]:
    return [Migration(model, old, None, removed_in, note) for old in keys]


EVAL_SCHEDULE_NOTE = "one schedule for every eval env: set orchestrator.eval.{key} (`rl eval` evaluates once)"
ENV_RESTARTS_NOTE = (
    "one restart policy: under rl every env server follows the top-level `restarts` (each its own budget); "
    "a standalone orchestrator's follow `orchestrator.restarts`, rl eval's its `restarts`"
)
DECLARED_ENV_KEYS = (
    "id", "name", "args", "address", "python", "project", "curve", "insecure", "pool", "max_retries",
    "pass_env", "timeout", "client", "train", "ratio",
)  # fmt: skip
"""The keys of `[[orchestrator.envs]]` but `sampling`: refused in an eval table, which names its env."""

FIXED = "fixed at {value} (the config surface's budget, issue 54)"
"""The note of a key that became a constant: what it is now."""

MIGRATIONS: tuple[Migration, ...] = (
    # 0.2.x: keys people did not change became constants or the env server's own (issue 54)
    *_removed("RLConfig", "0.3.0", ["shutdown_grace_s"], FIXED.format(value="15 s")),
    *_removed(
        "RLConfig", "0.3.0", ["log_rotation.max_mb", "log_rotation.keep"], FIXED.format(value="100 MiB, 3 copies")
    ),
    *_removed("RunRestarts", "0.3.0", ["window_s", "backoff_s"], FIXED.format(value="600 s, 1 s")),
    *_removed("SlurmConfig", "0.3.0", ["rendezvous_port"], FIXED.format(value="29500")),
    *_removed("WeightsConfig", "0.3.0", ["bucket_mb"], FIXED.format(value="256 MiB")),
    *_removed("InferenceConfig", "0.3.0", ["warmup_requests"], FIXED.format(value="16 requests")),
    *_removed("OrchestratorConfig", "0.3.0", ["env_ready_timeout_s"], FIXED.format(value="300 s")),
    *_removed("DistillConfig", "0.3.0", ["max_concurrency", "ready_timeout_s"], FIXED.format(value="16, 600 s")),
    *_removed("EnvConfig", "0.3.0", ["at_capacity_wait_s", "reconnect_timeout_s"], FIXED.format(value="300 s")),
    *_removed("AdvantageConfig", "0.3.0", ["eps"], FIXED.format(value="1e-6")),
    *_removed(
        "PoolShape",
        "0.3.0",
        ["idle_timeout_s", "grow_at"],
        "an env table's server grows and retires workers as `env-server`'s defaults do (60 s idle, at 0.75 of its "
        "capacity)",
    ),
    *_removed("RolloutTimeouts", "0.3.0", ["kill_grace_s"], FIXED.format(value="5 s for a server an env table starts")),
    *_removed(
        "ChatClientConfig",
        "0.3.0",
        ["return_tokens", "retry"],
        "an env's own client is token-less and retried as every chat client (`rl eval --client` still takes both)",
    ),
    # 0.2.0: env server protocol 3, the server's model client is its config (issue 40)
    *_removed(
        "EnvServerConfig",
        "0.2.0",
        ["model_access"],
        "an env server serves one model client, its `client` (env-server --client '<ClientConfig map>'; "
        "docs/protocol.md), and reaches nothing else",
    ),
    # 0.2.0: the launcher's own keys leave the process sections (issue 40)
    *_renamed(
        "RLConfig",
        "0.3.0",
        {
            "trainer.gpus": "placement.trainer.gpus",
            "trainer.num_procs": "placement.trainer.num_procs",
            "inference.gpus": "placement.inference.gpus",
            "inference.replicas": "placement.inference.replicas",
        },
    ),
    *_removed(
        "TrainerConfig", "0.3.0", ["gpus", "num_procs"], "only rl read it: set placement.trainer.* in rl's config"
    ),
    *_removed(
        "InferenceConfig",
        "0.3.0",
        ["gpus", "replicas"],
        "only rl read it: set placement.inference.* in rl's config (the inference command serves one replica)",
    ),
    # 0.2.0: names and units (issue 30); refused since
    *_removed("RLConfig", "0.2.0", ["shutdown_grace"], FIXED.format(value="15 s")),
    *_removed(
        "RunRestarts",
        "0.2.0",
        ["inference", "trainer", "orchestrator"],
        "one policy for every process rl starts, each with its own budget: set restarts.max_restarts, window_s, "
        "backoff_s, max_backoff_s",
    ),
    *_renamed("TrainerConfig", "0.2.0", {"max_tokens": "micro_batch_tokens"}),
    *_removed(
        "TrainerConfig", "0.2.0", ["batch_poll_s"], "the trainer polls every 20 ms (envrl.transport.batches.POLL_S)"
    ),
    *_removed(
        "TrainerConfig",
        "0.2.0",
        ["wait_log_interval_s"],
        "the trainer logs its wait every 30 s (envrl.transport.batches.WAIT_LOG_S)",
    ),
    *_removed(
        "LossConfig",
        "0.2.0",
        ["ppo_clip"],
        "clip = [low, high] turns clipping on (default [0.2, 0.2]), clip = false off",
    ),
    *_removed(
        "LossConfig",
        "0.2.0",
        ["clip_low", "clip_high"],
        "clip = [low, high]: the ratio is clipped to [1 - low, 1 + high]",
    ),
    *_removed(
        "LossConfig", "0.2.0", ["mask_low", "mask_high"], "ratio_mask = [low, high]: the ratios still trained on"
    ),
    *_renamed("SFTConfig", "0.2.0", {"max_tokens": "micro_batch_tokens"}),
    *_renamed("InferenceClientConfig", "0.2.0", {"ready_timeout": "ready_timeout_s"}),
    *_renamed(
        "OrchestratorConfig",
        "0.2.0",
        {"weights_timeout": "weights_timeout_s", "eval_envs": "eval.env"},
    ),
    *_removed("OrchestratorConfig", "0.2.0", ["env_ready_timeout"], FIXED.format(value="300 s")),
    *_removed("EnvConfig", "0.2.0", ["reconnect_timeout"], FIXED.format(value="300 s")),
    *_removed("EnvConfig", "0.2.0", ["restarts"], ENV_RESTARTS_NOTE),
    *[
        Migration("EvalScoringConfig", key, None, "0.2.0", EVAL_SCHEDULE_NOTE.format(key=key))
        for key in ("interval", "at_start", "at_end")
    ],
    *_renamed("EvalTableConfig", "0.2.0", {"train_env": "env"}),
    *_removed(
        "EvalTableConfig",
        "0.2.0",
        DECLARED_ENV_KEYS,
        "an eval env names a declared env: declare it in [[orchestrator.envs]] (with `train = false` for an "
        'eval-only env) and name it here with env = "<name>"',
    ),
    *_renamed("EvalCommandConfig", "0.2.0", {"env_ready_timeout": "env_ready_timeout_s"}),
    *_renamed("ScriptedClientConfig", "0.2.0", {"delay": "delay_s"}),
    *_renamed("RetryPolicy", "0.2.0", {"backoff": "backoff_s", "max_backoff": "max_backoff_s", "timeout": "timeout_s"}),
    *_renamed("PoolConfig", "0.2.0", {"idle_timeout": "idle_timeout_s"}),
    *_renamed(
        "EnvTimeoutConfig", "0.2.0", {"rollout": "rollout_s", "scoring": "scoring_s", "kill_grace": "kill_grace_s"}
    ),
    *_renamed(
        "EnvServerConfig",
        "0.2.0",
        {"client_stall_timeout": "client_stall_timeout_s", "drain_timeout": "drain_timeout_s"},
    ),
)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def envrl_version() -> str:
    """The installed envrl's version, or, run from a source copy that was never installed (the GPU
    kit's bare machine), the one its `pyproject.toml` names."""
    try:
        return version("envrl")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


def refused(migration: Migration, current: str | None = None) -> bool:
    """Whether the old key is an error in `current` (default: this envrl's version)."""
    return _release(current or envrl_version()) >= _release(migration.removed_in)


def for_model(models: Iterable[type], migrations: Sequence[Migration] = MIGRATIONS) -> list[Migration]:
    """The rows of `models` and their bases (a row of `EnvConfig` holds for every env table)."""
    names = {base.__name__ for model in models for base in model.__mro__}
    return [m for m in migrations if m.model in names]
