"""After `enable_stack_dumps()`, SIGUSR1 writes every thread's and asyncio task's stack to stderr;
`collect_stacks(root)` signals only descendants known to keep that handler, bounded by `MAX_STACK_BYTES` each
(stdlib only)."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STACKS_SIGNAL = signal.SIGUSR1
DUMPING_MODULES = (
    "envrl.orchestrator.main",
    "envrl.trainer.main",
    "envrl.serve.main",
    "envrl.serve.worker",
    "envrl.inference.main",
    "envrl.eval.main",
)
"""Entry points whose processes keep the SIGUSR1 handler (the ones that call `die_with_parent`
and install no SIGUSR1 handler of their own afterwards)."""
SCRIPTS = {
    "trainer": "envrl.trainer.main",
    "inference": "envrl.inference.main",
    "env-server": "envrl.serve.main",
    "orchestrator": "envrl.orchestrator.main",
}
"""The console scripts of those entry points (pyproject's `[project.scripts]`)."""
MAX_STACK_BYTES = 64 * 1024
"""Most bytes of one process's dump read back (faulthandler writes up to 100 frames per thread)."""
SETTLE_S = 0.2
"""A dump is complete once its log has not grown for this long (faulthandler writes at once)."""
WAIT_S = 3.0
"""Longest wait for one process's dump (a stopped process never writes one)."""


_enabled = False


def enable_stack_dumps() -> None:
    """SIGUSR1 writes every thread's Python stack to stderr at once (faulthandler, even while the
    interpreter is stuck), then, when the main thread next runs Python, where each asyncio task of
    its running loop awaits (a thread's stack shows an idle loop only). `kill -USR1 <pid>` too."""
    global _enabled
    if _enabled or not hasattr(faulthandler, "register") or threading.current_thread() is not threading.main_thread():
        return  # once: a second `signal.signal` would replace faulthandler's handler, which stays registered
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no stderr to write to: leave SIGUSR1 alone
        return
    _enabled = True
    signal.signal(STACKS_SIGNAL, _write_task_stacks)
    faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=True)


def _write_task_stacks(signum: int, frame: object) -> None:
    """The Python-level half of SIGUSR1: the running loop's tasks, written with one os.write (a
    buffered stderr may be mid-write in the frame this handler interrupted)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    os.write(2, ("\n".join(task_stacks(loop)) + "\n").encode(errors="replace"))


def task_stacks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Where each asyncio task of `loop` is suspended, innermost frame first (from another thread
    as well: best effort)."""
    lines = [f"asyncio tasks of pid {os.getpid()} (where each awaits, innermost first):"]
    try:
        tasks = list(asyncio.all_tasks(loop))
    except RuntimeError as e:
        return [*lines, f"  (cannot list them: {e})"]
    for task in tasks:
        frames = _await_chain(task)
        where = " <- ".join(f"{f.f_code.co_name} ({f.f_code.co_filename}:{f.f_lineno})" for f in frames[::-1])
        lines.append(f"  {task.get_name()}: {where or 'not started'}")
    return lines


def thread_stacks() -> str:
    """Every thread's Python stack in this process, innermost frame last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, ident)!r}:\n{stack}")
    return "\n".join(parts)


def _await_chain(task: asyncio.Task) -> list[Any]:
    """The frames of the coroutines `task` awaits through, outermost first (a task's own
    `get_stack` gives only the outermost frame of a suspended coroutine)."""
    frames, awaited = [], task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return frames


@dataclass(frozen=True)
class ProcessStacks:
    pid: int
    role: str
    """The entry point it runs (`envrl.trainer.main`, ...)."""
    log: str
    """Where its stderr goes (its log file under `rl`)."""
    stacks: str
    """What it wrote after SIGUSR1 (or why there is nothing)."""


def collect_stacks(root: int, skip: int | None = None) -> list[ProcessStacks]:
    """Ask every envrl process below `root` (not `skip`) for its stacks, one at a time, and read
    them back from its stderr's file; empty on a system without /proc."""
    found = []
    for pid in _descendants(root):
        if pid == skip or (role := _role(pid)) is None:
            continue
        found.append(_ask(pid, role))
    return found


def _ask(pid: int, role: str) -> ProcessStacks:
    try:
        log = os.readlink(f"/proc/{pid}/fd/2")
    except OSError as e:
        return ProcessStacks(pid, role, "?", f"(cannot find its stderr: {e})")
    path = Path(log)
    if not path.is_file():
        return ProcessStacks(pid, role, log, "(its stderr is not a file: its stacks went there)")
    start = path.stat().st_size
    try:
        os.kill(pid, STACKS_SIGNAL)
    except OSError as e:
        return ProcessStacks(pid, role, log, f"(cannot signal it: {e})")
    size, changed, deadline = start, time.monotonic(), time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = path.stat().st_size
        if now != size:
            size, changed = now, time.monotonic()
        elif size > start and time.monotonic() - changed >= SETTLE_S:
            break
    if size == start:
        state = _state(pid)
        return ProcessStacks(pid, role, log, f"(no stacks within {WAIT_S:g} s; process state: {state})")
    with path.open("rb") as f:
        f.seek(start)
        text = f.read(min(size - start, MAX_STACK_BYTES)).decode(errors="replace")
    return ProcessStacks(pid, role, log, text)


def _descendants(root: int) -> list[int]:
    """`root`'s descendants, parents before children (from /proc/<pid>/task/*/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        children: list[int] = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                children += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        out += children
        todo += children
    return out


def _role(pid: int) -> str | None:
    """The envrl entry point `pid` runs, if it is one that dumps its stacks on SIGUSR1."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    script = SCRIPTS.get(Path(argv[1].decode(errors="replace")).name) if len(argv) > 1 else None
    if script is not None:
        return script
    if len(argv) < 3 or argv[1] != b"-m":
        return None
    module = argv[2].decode(errors="replace")
    if module == "envrl.runtime.guarded" and len(argv) > 3:  # a torchrun rank: guarded runs the module
        module = argv[3].decode(errors="replace")
    return module if module in DUMPING_MODULES else None


def _state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"
