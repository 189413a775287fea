"""The env author's public API: every name in `__all__` keeps its meaning and path within a minor version, a moved one
warns for one more (docs/CHANGELOG.md); importing it needs only the light install (docs/environments.md)."""

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
