"""Environments by id: `load_environment(env_id, **args)` returns an `Environment` with its `env_id` set, or raises
`EnvironmentNotFound` naming the installed ids (`package.module:function` and `verifiers:<id>` ids too)."""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import Any

from envrl.envs.environment import Environment

ENTRY_POINT_GROUP = "envrl.environments"
ADAPTERS = {"verifiers": "envrl.envs.adapters.verifiers"}
"""`<prefix>:<id>` ids served by an adapter module's `load_environment(id, **args)`."""


class EnvironmentNotFound(LookupError):
    pass


def installed_environment_ids() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def environment_loader(env_id: str) -> Any:
    """The function that builds env `env_id`; EnvironmentNotFound naming what is installed."""
    prefix, _, foreign_id = env_id.partition(":")
    if prefix in ADAPTERS:
        try:
            adapter = importlib.import_module(ADAPTERS[prefix])
        except ModuleNotFoundError as e:
            raise EnvironmentNotFound(
                f"environment {env_id!r} needs the {e.name!r} package, which this interpreter lacks; run its env "
                f"server in a project that has it (docs/adapters.md)"
            ) from e
        return functools.partial(adapter.load_environment, foreign_id)
    if ":" in env_id:
        module_name, _, attr = env_id.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise EnvironmentNotFound(f"environment {env_id!r}: cannot import module {module_name!r} ({e})") from e
        if not hasattr(module, attr):
            raise EnvironmentNotFound(f"environment {env_id!r}: module {module_name!r} has no {attr!r}")
        return getattr(module, attr)
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == env_id]
    if not matches:
        installed = ", ".join(installed_environment_ids()) or "none"
        raise EnvironmentNotFound(
            f"no environment {env_id!r} is installed (entry-point group {ENTRY_POINT_GROUP!r}); "
            f"installed: {installed}. Install its package, or pass 'package.module:function'."
        )
    return matches[0].load()


def load_environment(env_id: str, **args: Any) -> Environment:
    """The environment `env_id`, built by its package's `load_environment(**args)`."""
    env = environment_loader(env_id)(**args)
    if not isinstance(env, Environment):
        raise TypeError(f"the loader of environment {env_id!r} returned {type(env).__name__}, not an envrl Environment")
    env.env_id = env_id
    return env


def main(argv: list[str] | None = None) -> None:
    """`rl envs`: the environment ids this interpreter serves, with the package that registers each."""
    if argv in (["-h"], ["--help"]):
        print("usage: rl envs\n\nLists the environment ids this interpreter serves and the package registering each.")
        return
    if argv:
        raise SystemExit(f"rl envs: takes no arguments, got {' '.join(argv)}")
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        dist = ep.dist.name if ep.dist is not None else "?"
        print(f"{ep.name:<24} {dist:<28} {ep.value}")
    for prefix, module in ADAPTERS.items():
        print(f"{prefix + ':<id>':<24} {'(adapter)':<28} {module}: served in an env's own venv (docs/adapters.md)")
    print("also: 'package.module:function' loads an unpackaged env; an env's `project` serves it from its own venv")
