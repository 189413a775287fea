"""The one child-process abstraction: a `spawn`ed child dies with its parent, its exit is seen at once, a sidecar
that dies before ready raises `ChildFailed` with its log tail; `kill_tree` leaves no live descendant behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from envrl.runtime.lifeline import PARENT_PID_ENV
from envrl.runtime.secrets import API_KEY_ENV

READY_FD_ENV = "ENVRL_READY_FD"
"""Set by `spawn_sidecar`: the pipe fd on which the child writes its ready line."""
READY_PREFIX = "envrl-ready "
"""Prefix of the one stdout line (and pipe line) a sidecar writes when it is ready."""
ALLOWED_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "TMPDIR", "VIRTUAL_ENV",
     "PYTHONPATH", "PYTHONHASHSEED", "UV_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
     "TRANSFORMERS_OFFLINE", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
     "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "UV_PYTHON_INSTALL_DIR", "UV_OFFLINE", "ENVRL_CHAOS_RUN", API_KEY_ENV}
)  # fmt: skip
"""What a process running model-driven code (an env server, its workers, their harness programs)
inherits from the launcher: locale, paths, caches and proxies, the run marker by which the
chaos scripts and tests find every process of a run, and the inference API key (it allows only
what an env server does anyway: generate); no other tokens or keys."""
ALLOWED_ENV_PREFIXES = ("LC_", "ENVRL_OPENENV_URL_")


def allowed_environ(passed: Iterable[str] = (), environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The part of `environ` an untrusted child may see: `ALLOWED_ENV`, `ALLOWED_ENV_PREFIXES`, and
    the names in `passed` (an env's `pass_env`, its model clients' `api_key_env`s)."""
    wanted = ALLOWED_ENV | set(passed)
    return {k: v for k, v in environ.items() if k in wanted or k.startswith(ALLOWED_ENV_PREFIXES)}


CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 controls but tab and newline: escape sequences a terminal acts on (colours, cursor
moves, a window title, OSC 52's clipboard write)."""


def printable(text: str) -> str:
    """`text` with its control characters as `\\xNN` escapes, safe to print to a terminal."""
    return CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class ChildFailed(RuntimeError):
    """A child died or stalled before it was ready; the message names it and shows its log tail."""


class Child:
    """A running child process: its pid, a pollable exit fd, its log, and a polite way to stop it."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_file: Path | None) -> None:
        self.name = name
        self.popen = popen
        self.log_file = log_file
        self.exit_fd = os.pidfd_open(popen.pid)
        """Readable (for select/poll/zmq.Poller/add_reader) as soon as the child has exited."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def describe_exit(self) -> str:
        code = self.popen.poll()
        if code is None:
            return "is still running"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the child's log file ('' when it has none), with control
        characters shown as escapes (`printable`): it goes to a terminal, and a log can hold what
        a model wrote."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        with self.log_file.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode(errors="replace")
        return "\n".join(printable(line) for line in text.splitlines()[-lines:])

    def failure(self, what: str) -> ChildFailed:
        """A ChildFailed saying `what` happened to this child (`describe_exit()` helps), with its log tail."""
        tail = self.log_tail()
        where = (
            f"; last lines of {self.log_file}:\n{tail}" if tail else f" (log: {self.log_file or 'inherited stderr'})"
        )
        return ChildFailed(f"{self.name} (pid {self.pid}) {what}{where}")

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> int:
        """Send `sig`, wait up to `grace` seconds, then SIGKILL; return the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            if self.wait(grace) is None:
                self.popen.kill()
        code = self.popen.wait()
        self.close()
        return code

    def close(self) -> None:
        if self.exit_fd >= 0:
            os.close(self.exit_fd)
            self.exit_fd = -1


def _children(pid: int) -> list[int]:
    """`pid`'s children, exited ones too (Linux's /proc/PID/task/TID/children); none once it is gone."""
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                found += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return found


def _running(pid: int) -> bool:
    """Not yet exited (a zombie waiting for its reaper has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def kill_tree(root: int) -> None:
    """SIGKILL every live descendant of `root` (not `root` itself), until none is left.

    `root` must be a subreaper (`lifeline.become_subreaper`) that is stopped or is the caller:
    then the orphans of a killed process come back to `root` and the next pass finds them, and
    a daemon that double-forked and called setsid is still a descendant (even when its parent
    exits while the tree is walked: `root`'s children are read again before it returns). Walking
    the tree of /proc/PID/task/TID/children (a kernel with CONFIG_PROC_CHILDREN, as distribution
    kernels have), not process groups or sessions: those a program leaves with one setsid; a pid
    namespace or a cgroup would need privileges envrl does not have.
    """
    while True:
        first = _children(root)
        found, stack = [], list(first)
        while stack:
            pid = stack.pop()
            if _running(pid):
                found.append(pid)
                stack += _children(pid)
        # A child that exited between the two reads had its own children reparented to `root` before
        # it showed as a zombie, so they are in a second read of `root`'s children, not the first.
        if not found and set(_children(root)) == set(first):
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # let the killed exit, so the next pass sees what was reparented


def spawn(
    argv: Sequence[str],
    *,
    name: str,
    log_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    cwd: Path | None = None,
) -> Child:
    """Start `argv` as a child named `name` (stdout and stderr appended to `log_file`, else inherited).

    The child gets its own process group, so a terminal's Ctrl-C reaches only this process,
    which then stops its children in order. Call from a thread that lives as long as the child
    (the main thread): Linux sends the parent-death signal when the *thread* that spawned it exits.
    """
    child_env = dict(os.environ if env is None else env)
    child_env[PARENT_PID_ENV] = str(os.getpid())
    out: Any = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        out = log_file.open("ab")
    try:
        popen = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT if out else None, env=child_env,
            pass_fds=tuple(pass_fds), cwd=cwd, process_group=0,
        )  # fmt: skip
    finally:
        if out is not None:
            out.close()
    return Child(name, popen, log_file)


class StartingSidecar:
    """A sidecar spawned but not yet ready (`begin_sidecar`): `ready()` waits for its ready line,
    `abandon()` stops it. Several begun together load at once; each is waited for on its own."""

    def __init__(self, child: Child, read_fd: int, timeout: float) -> None:
        self.child = child
        self._read_fd: int | None = read_fd
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout

    def ready(self) -> str:
        """Its ready message; `ChildFailed` (the child stopped) if it exits first or stays silent
        past its `ready_timeout`, counted from its spawn."""
        assert self._read_fd is not None, "ready() or abandon() was called already"
        try:
            return _read_ready_line(self.child, self._read_fd, self._deadline, self._timeout)
        except BaseException:
            self.child.stop(grace=5.0)
            raise
        finally:
            self._close()

    def abandon(self) -> None:
        """Stop it without waiting for it (another sidecar begun with it failed)."""
        self.child.stop(grace=5.0)
        self._close()

    def _close(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None


def begin_sidecar(
    argv: Sequence[str],
    *,
    name: str,
    log_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 120.0,
) -> StartingSidecar:
    """Spawn a child that calls `report_ready(message)`; `.ready()` of the result returns that
    message. The message (an env server's bound address, say) comes over a pipe, so a child can
    bind port 0 and there is no free-port race."""
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env[READY_FD_ENV] = str(write_fd)
    try:
        child = spawn(argv, name=name, log_file=log_file, env=child_env, pass_fds=[write_fd])
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return StartingSidecar(child, read_fd, ready_timeout)


def spawn_sidecar(
    argv: Sequence[str],
    *,
    name: str,
    log_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 120.0,
) -> tuple[Child, str]:
    """Start a child that calls `report_ready(message)`, and return it with that message.

    If the child exits first, it is noticed at once; if it stays silent past `ready_timeout`, it
    is killed. Either way `ChildFailed` says so (`begin_sidecar`, then `ready`).
    """
    starting = begin_sidecar(argv, name=name, log_file=log_file, env=env, ready_timeout=ready_timeout)
    return starting.child, starting.ready()


def _read_ready_line(child: Child, read_fd: int, deadline: float, timeout: float) -> str:
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            child.kill()
            child.wait()
            raise child.failure(f"did not report ready within {timeout:g} s (ready_timeout) and was killed")
        readable, _, _ = select.select([read_fd, child.exit_fd], [], [], left)
        if read_fd in readable:
            chunk = os.read(read_fd, 4096)
            data += chunk
            if chunk:
                continue
        if child.exit_fd in readable or read_fd in readable:
            child.wait(1.0)
            raise child.failure(f"{child.describe_exit()} before reporting ready")
    line = data.split(b"\n", 1)[0].decode()
    return line.removeprefix(READY_PREFIX)


def report_ready(message: str) -> None:
    """Child side of `spawn_sidecar`: print the ready line and hand it to the parent's pipe, if any."""
    line = f"{READY_PREFIX}{message}\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is not None:
        try:
            os.write(int(fd), line.encode())
            os.close(int(fd))
        except OSError:
            pass  # the parent stopped listening; it watches our exit instead


def config_argv(config: BaseModel) -> list[str]:
    """`--key value` overrides that make `load_config` rebuild `config` in a child process.

    Text values go as they are, everything else as JSON (nested None as null); top-level None
    values are left out, so they must be the field's default.
    """
    argv: list[str] = []
    for key, value in config.model_dump(mode="json").items():
        if value is not None:
            argv += [f"--{key}", value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))]
    return argv
