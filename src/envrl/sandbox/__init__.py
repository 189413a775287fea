"""Sandboxed execution of model-written code: one sandbox per episode, typed failures (`SandboxError`), nothing left
behind; providers behind one API (threat model: docs/sandbox.md)."""

from envrl.sandbox.base import CommandResult, Sandbox, SandboxConfig, SandboxProvider
from envrl.sandbox.bubblewrap import BubblewrapProvider, BubblewrapSandbox
from envrl.sandbox.errors import (
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxLimit,
    SandboxOOM,
    SandboxProtocolError,
    SandboxStartError,
    SandboxTimeout,
)
from envrl.sandbox.limits import Limits
from envrl.sandbox.pool import WarmPool

__all__ = [
    "BubblewrapProvider",
    "BubblewrapSandbox",
    "CommandResult",
    "Limits",
    "Sandbox",
    "SandboxClosed",
    "SandboxConfig",
    "SandboxDied",
    "SandboxError",
    "SandboxLimit",
    "SandboxOOM",
    "SandboxProtocolError",
    "SandboxProvider",
    "SandboxStartError",
    "SandboxTimeout",
    "WarmPool",
]
