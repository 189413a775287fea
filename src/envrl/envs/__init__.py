"""Environments: tasks, rollouts, rewards and the model clients they call (docs/environments.md)."""

from envrl.envs.environment import Environment, Split, TaskSource
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

__all__ = [
    "ClientConfig",
    "Environment",
    "EnvironmentNotFound",
    "EvalClientConfig",
    "ModelClient",
    "ModelResponse",
    "RolloutState",
    "Rubric",
    "SamplingArgs",
    "ScriptedClient",
    "ScriptedClientConfig",
    "Split",
    "TaskSource",
    "ToolEnvironment",
    "TrainClientConfig",
    "build_client",
    "installed_environment_ids",
    "load_environment",
]
