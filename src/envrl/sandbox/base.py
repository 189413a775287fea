"""The sandbox API: a `Sandbox` belongs to one episode, whose wall-clock cap (start-up included) bounds every call;
`close()` is idempotent and leaves no process alive; its own failures raise `SandboxError`."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from envrl.config import BaseConfig
from envrl.sandbox.errors import SandboxLimit, SandboxOOM, SandboxTimeout
from envrl.sandbox.limits import Limits
from envrl.sandbox.uids import COUNT, FIRST

LimitName = Literal["timeout", "memory", "cpu", "file_size", "disk", "nproc"]
_SIGXCPU, _SIGXFSZ = 24, 25


class SandboxConfig(BaseConfig):
    """One episode's sandbox: what it sees, what it may use, how long it may live."""

    python: Path = Path("/usr/bin/python3")
    """The image's interpreter (runs the sandbox's agent and `run_python`); must be readable by
    an unprivileged user, with every directory above it."""
    image: list[Path] = Field(default_factory=lambda: [Path("/usr")])
    """Host directories mounted read-only at the same path (the interpreter's prefix, the env's
    venv, data). `/bin`, `/lib`, `/lib64` link into `/usr`."""
    workdir: str = "/work"
    """The sandbox's writable directory (a fresh tmpfs of `limits.disk_mib`; also `/tmp`)."""
    network: bool = False
    """Share the host's network (off: the sandbox has only its own loopback)."""
    episode_s: float = Field(300.0, gt=0)
    """Wall-clock cap of the whole episode's sandbox, start-up and every call included."""
    start_timeout_s: float = Field(30.0, gt=0)
    """Longest start-up (within `episode_s`); past it the start fails as `sandbox_start`."""
    command_timeout_s: float = Field(30.0, gt=0)
    """Default per-command timeout (a command past it is killed with everything it started)."""
    limits: Limits = Limits()
    host_uids: tuple[int, int] = (FIRST, FIRST + COUNT)
    """[first, end): the host user ids sandboxes run as, one each. A uid a user, a group, a
    subordinate id range or a process already has is skipped (uids.py)."""

    @field_validator("host_uids")
    @classmethod
    def _uid_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        first, end = value
        if not 0 < first < end <= 0xFFFFFFFF:
            raise ValueError(f"sandbox.host_uids must be [first, end) with 0 < first < end <= 4294967295, got {value}")
        return value


@dataclass(frozen=True)
class CommandResult:
    """What one command did. `exit_code` < 0 means killed by that signal."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    """Ran past its timeout and was killed, with everything else running in the sandbox."""
    truncated: bool = False
    """More output than `limits.max_output_kib` per stream; the rest was dropped."""

    @property
    def limit(self) -> LimitName | None:
        """The limit the command most likely ran into (None: none seen)."""
        if self.timed_out:
            return "timeout"
        if self.exit_code == -_SIGXCPU:
            return "cpu"
        if self.exit_code == -_SIGXFSZ or "File too large" in self.stderr:
            return "file_size"
        if "MemoryError" in self.stderr or "Cannot allocate memory" in self.stderr:
            return "memory"
        if "No space left on device" in self.stderr:
            return "disk"
        if "Resource temporarily unavailable" in self.stderr and "fork" in self.stderr.lower():
            return "nproc"
        return None

    def raise_for_limit(self) -> CommandResult:
        """This result, or `SandboxOOM` / `SandboxTimeout` / `SandboxLimit` if it hit a limit:
        for envs where a limit hit is an infrastructure failure, not the model's doing."""
        limit = self.limit
        if limit is None:
            return self
        message = f"a sandboxed command hit its {limit} limit (exit {self.exit_code}): {self.stderr[-300:]}"
        if limit == "memory":
            raise SandboxOOM(message)
        if limit == "timeout":
            raise SandboxTimeout(message)
        raise SandboxLimit(message)


class Sandbox(abc.ABC):
    """One episode's sandbox; use `async with provider.create(...) as box` or call `close()`."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.deadline = time.monotonic() + config.episode_s
        """`time.monotonic()` at which the episode's cap runs out."""

    def time_left(self, what: str) -> float:
        """Seconds left under the episode's cap; `SandboxTimeout` naming `what` if none."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxTimeout(
                f"{what}: the sandbox's episode cap of {self.config.episode_s:g} s (sandbox.episode_s, start-up "
                "included) ran out"
            )
        return left

    def restart_clock(self) -> None:
        """Start the episode cap afresh: a warm sandbox handed to a new episode."""
        self.deadline = time.monotonic() + self.config.episode_s

    @property
    def alive(self) -> bool:
        """Started, not closed, not past its cap (a backend may know more)."""
        return self.deadline > time.monotonic()

    @abc.abstractmethod
    async def start(self) -> None:
        """Start it; `SandboxStartError` (or `SandboxTimeout`) if it cannot be started."""

    @abc.abstractmethod
    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | None = None,
        cwd: str | None = None,
        isolate: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run `cmd` (a shell line, or argv) in the sandbox's working directory, or `cwd`.
        `timeout` defaults to `command_timeout_s` and is cut to what the episode has left.
        `env`: variables set for this command over the sandbox's own (PATH, HOME, LANG, TMPDIR).
        `isolate` (deprecated in 0.2, gone in 0.3: it is no clean room, the files it runs were
        written while the episode ran): kill everything earlier commands left running first;
        what decides a reward runs through `verdict`."""

    async def verdict(
        self, cmd: str | Sequence[str], files: Mapping[str, bytes | str], *, timeout: float | None = None
    ) -> CommandResult:
        """The only way to run what decides a reward: in a clean room. Every process the episode
        started is killed first; then `files` (relative names) are created, only by the host and
        only as new regular files, in a directory made after that, which is `cmd`'s working
        directory, HOME and TMPDIR. Nothing the episode left can change the inputs or swap the
        program. A room the episode made impossible (its disk full) is the program's failure
        (exit 126), and so is a sandbox that dies during the verdict (exit -9: only the judged
        program ran, so it killed the agent; never an error Trace a model could hide a 0 behind).
        Later calls see the sandbox without the episode's processes."""
        raise NotImplementedError(f"{type(self).__name__} has no clean room for a verdict")

    async def forward_host_ports(self, ports: Sequence[int]) -> None:
        """Let code in the sandbox reach these host loopback TCP ports at the same address
        (`127.0.0.1:PORT` inside means `127.0.0.1:PORT` of the host) and no other; the rest of
        the network stays as `network` says. A provider that cannot raises `NotImplementedError`."""
        raise NotImplementedError(f"{type(self).__name__} cannot forward host ports into the sandbox")

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file (relative paths: under `workdir`)."""

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        """Read up to `max_bytes` of a file; `FileNotFoundError` if it is not there."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop it and everything it runs (idempotent; safe in `finally` of a cancelled task)."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxProvider(abc.ABC):
    """Makes started sandboxes: the local bubblewrap backend, a warm pool, or a remote service."""

    @abc.abstractmethod
    async def create(self, config: SandboxConfig) -> Sandbox:
        """A started sandbox for one episode (its cap counts from the moment this is called)."""

    async def aclose(self) -> None:  # noqa: B027 - most providers hold nothing
        """Release what the provider holds (a pool's warm sandboxes)."""


async def started(sandbox: Sandbox) -> Sandbox:
    """`sandbox`, started; closed again if starting fails or is cancelled."""
    try:
        await sandbox.start()
    except BaseException:
        await asyncio.shield(sandbox.close())
        raise
    return sandbox
