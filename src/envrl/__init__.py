"""envrl: RL post-training with environments served as supervised processes.

Guarantee: every moved public module path (`MOVED`) still imports, warning once, until its row's version."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import NamedTuple


class Moved(NamedTuple):
    new: str
    since: str
    removed_in: str


_REGROUP = ("0.2", "0.3")
"""The tree regroup (issue 30): root modules into data/, runtime/ and telemetry/, the model client
library into model/, `rl eval` into eval/."""

MOVED: dict[str, Moved] = (
    {
        old: Moved(new, *_REGROUP)
        for old, new in {
            "envrl.traces": "envrl.data.traces",
            "envrl.seeds": "envrl.data.seeds",
            "envrl.samples": "envrl.data.samples",
            "envrl.layout": "envrl.data.layout",
            "envrl.atomic": "envrl.runtime.atomic",
            "envrl.guarded": "envrl.runtime.guarded",
            "envrl.http": "envrl.runtime.http",
            "envrl.lifeline": "envrl.runtime.lifeline",
            "envrl.net": "envrl.runtime.net",
            "envrl.process": "envrl.runtime.process",
            "envrl.console": "envrl.telemetry.console",
            "envrl.ledger": "envrl.telemetry.ledger",
            "envrl.log": "envrl.telemetry.log",
            "envrl.metrics": "envrl.telemetry.metrics",
            "envrl.progress": "envrl.telemetry.progress",
            "envrl.envs.model_client": "envrl.model.client",
            "envrl.envs.chat_tokens": "envrl.model.chat_tokens",
            "envrl.envs.tool_calls": "envrl.model.tool_calls",
            "envrl.inference.client": "envrl.model.inference",
            "envrl.inference.replicas": "envrl.model.replicas",
            "envrl.orchestrator.envs": "envrl.envclient.handles",
            "envrl.orchestrator.evaluate": "envrl.eval.main",
        }.items()
    }
    | {
        old: Moved(new, "0.2", "0.3")
        for old, new in {  # the client side of env servers left the orchestrator (issue 40)
            "envrl.orchestrator.env_config": "envrl.envclient.config",
            "envrl.orchestrator.env_handles": "envrl.envclient.handles",
            "envrl.orchestrator.eval_grid": "envrl.envclient.eval_grid",
            "envrl.launcher.supervisor": "envrl.runtime.supervisor",
        }.items()
    }
    | {
        old: Moved(new, "0.2", "0.3")
        for old, new in {  # every file format and client has one home (issue 54)
            "envrl.serve.client": "envrl.envclient.client",
            "envrl.envs.forked": "envrl.runtime.forked",
            "envrl.envs.adapters.chat_proxy": "envrl.proxy.chat",
            "envrl.envs.adapters.warm_programs": "envrl.runtime.warm.programs",
        }.items()
    }
)
"""Old module path -> where it lives now, the version that moved it and the first version without
the old path (a row is deleted in that version, with a line in docs/CHANGELOG.md)."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers only for the old paths of `MOVED`, and only after every other finder found nothing."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        moved = MOVED[spec.name]
        warnings.warn(  # importlib's own frames are skipped: stacklevel 2 is the importing line
            f"{spec.name} moved to {moved.new} in envrl {moved.since}; the old path goes in {moved.removed_in}: "
            f"import {moved.new} (or the env-author names from envrl.envs) instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(moved.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name; the old name is an alias of it."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
