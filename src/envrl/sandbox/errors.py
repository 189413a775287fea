"""Typed sandbox failures: each `SandboxError` names its cause as one machine-readable word, the `Error.type` of the
Trace it ends (never a reward of 0)."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """Base of every sandbox failure; `error_type` becomes the Trace's `Error.type`."""

    error_type = "sandbox_error"


class SandboxStartError(SandboxError):
    """The sandbox could not be started (bubblewrap missing, an image path unreadable, start-up too slow)."""

    error_type = "sandbox_start"


class SandboxTimeout(SandboxError):
    """The episode's wall-clock cap (`SandboxConfig.episode_s`, start-up included) ran out."""

    error_type = "sandbox_timeout"


class SandboxDied(SandboxError):
    """The sandbox's agent went away (killed from inside, crashed) before answering."""

    error_type = "sandbox_died"


class SandboxProtocolError(SandboxError):
    """A frame on the agent's answer pipe that is not the answer to the request just sent (it does
    not echo that request's nonce and sequence number): forged or out of step. Nothing it said is
    used; the sandbox is killed."""

    error_type = "sandbox_protocol"


class SandboxClosed(SandboxError):
    """The sandbox was already closed (end of episode, cancel) when it was used."""

    error_type = "sandbox_closed"


class SandboxLimit(SandboxError):
    """A command broke a limit (CPU time, processes, file size, disk) and the env treats that as fatal."""

    error_type = "sandbox_limit"


class SandboxOOM(SandboxLimit):
    """A command ran out of the sandbox's memory limit and the env treats that as fatal."""

    error_type = "sandbox_oom"
