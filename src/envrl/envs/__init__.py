"""The public API for env authors: environments, tasks and traces, rewards, the model clients
envs call and the sandbox they run model-written code in (docs/environments.md, The public API).

Guarantee: every name in `__all__` keeps its meaning and this import path within a minor version
and, when it moves or goes, stays importable here with a `DeprecationWarning` for at least one
more minor version (docs/CHANGELOG.md, Versioning). Importing it needs only envrl's light
install (no torch, vLLM or wandb). Adapters for foreign envs live at `envrl.envs.adapters.<name>`.
"""

from envrl.data.traces import Error, Message, Split, Task, Trace, Turn
from envrl.envs.environment import Environment, TaskSource
from envrl.envs.registry import EnvironmentNotFound, installed_environment_ids, load_environment
from envrl.envs.rubric import Rubric
from envrl.envs.state import RolloutState
from envrl.envs.tools import ToolEnvironment
from envrl.model.client import (
    ClientConfig,
    EvalClientConfig,
    ModelClient,
    ModelResponse,
    SamplingArgs,
    ScriptedClient,
    ScriptedClientConfig,
    TrainClientConfig,
    build_client,
)
from envrl.sandbox import (
    BubblewrapProvider,
    CommandResult,
    Limits,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxProvider,
    WarmPool,
)
from envrl.sandbox.venv import sandbox_venv

__all__ = [
    "BubblewrapProvider",
    "ClientConfig",
    "CommandResult",
    "Environment",
    "EnvironmentNotFound",
    "Error",
    "EvalClientConfig",
    "Limits",
    "Message",
    "ModelClient",
    "ModelResponse",
    "RolloutState",
    "Rubric",
    "SamplingArgs",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxProvider",
    "ScriptedClient",
    "ScriptedClientConfig",
    "Split",
    "Task",
    "TaskSource",
    "ToolEnvironment",
    "Trace",
    "TrainClientConfig",
    "Turn",
    "WarmPool",
    "build_client",
    "installed_environment_ids",
    "load_environment",
    "sandbox_venv",
]
