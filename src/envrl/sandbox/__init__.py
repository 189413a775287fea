"""Sandboxed execution of model-written code: one sandbox per episode, typed failures, nothing left behind.

`SandboxConfig` says what a sandbox sees and may use; a `SandboxProvider` makes started
`Sandbox`es (`BubblewrapProvider` locally, `WarmPool` in front of it, a remote service behind the
same API); `SandboxError` subclasses carry the `Error.type` of the Trace a failure ends.
docs/sandbox.md has the threat model.
"""

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
