"""`die_with_parent`: a spawned child gets `sig` when its parent dies, even by SIGKILL and even before the call;
standard library only, so entry points call it first; SIGUSR1 then dumps the process's stacks."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from envrl.runtime.stacks import enable_stack_dumps

PARENT_PID_ENV = "ENVRL_PARENT_PID"
"""Set by `spawn` in the child's environment: the pid the child must not outlive."""

ORPHAN_GRACE_S = 15.0
"""Seconds an orphan gets to stop on `die_with_parent`'s signal before it SIGKILLs itself (the
launcher's own `shutdown_grace_s` plays this part while it lives)."""

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_parent = 0
"""The pid `die_with_parent` watches (0: none)."""


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send `sig` to this process when its parent thread dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def become_subreaper() -> None:
    """Make this process the reaper of its descendants' orphans (Linux only), so a daemon that a
    child starts (double fork, setsid) stays among this process's descendants, where `kill_tree` finds it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGTERM, check_interval: float = 1.0, kill_after: float = ORPHAN_GRACE_S) -> None:
    """Child side of `spawn`: receive `sig` when the parent dies, even by SIGKILL.

    Linux's PR_SET_PDEATHSIG does the work; a daemon thread polling the parent pid backs it up
    (other platforms, or a parent that died before this call), and sends SIGKILL if the process
    is still alive `kill_after` seconds after its parent died: nobody is left to escalate, and a
    graceful shutdown can hang (vLLM's uvicorn waited forever on a weight reload cut short). No-op if not started by `spawn`,
    and on a second call (the variable is popped: our own children are not its children).
    Either way SIGUSR1 then dumps the process's Python stacks to stderr (`runtime/stacks.py`).
    """
    global _parent
    enable_stack_dumps()
    parent = int(os.environ.pop(PARENT_PID_ENV, "0"))
    if not parent:
        return
    _parent = parent
    set_parent_death_signal(sig)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_interval)
        os.kill(os.getpid(), sig)
        time.sleep(kill_after)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def parent_pid() -> int | None:
    """The pid this process dies with, or None when it was not started by `spawn` (run by hand)."""
    return _parent or None


def adopt_children() -> None:
    """Make the children this process starts from now on die with it (call after `die_with_parent`).

    For a process that starts its own children without `spawn` (torchrun): they inherit the
    environment, so a child calling `die_with_parent` then watches this process instead of
    killing itself for not being a child of the original parent.
    """
    os.environ[PARENT_PID_ENV] = str(os.getpid())
