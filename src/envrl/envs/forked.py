"""Run a synchronous function in a forked child that is killed at its deadline.

Guarantee: `run_forked(fn, timeout)` returns `fn()`'s result, re-raises its failure
as `ForkedCallError`, or raises `TimeoutError` once `timeout` seconds have passed since the child
started; in every case (cancellation included) the child is killed and reaped before it returns,
so a CPU-bound function cannot outlive its deadline as a thread would. Waiting for one of the
`os.cpu_count()` slots does not count against the deadline. A plain `os.fork` is used (not
multiprocessing), so it also works inside daemonic worker processes. The child's answer comes
back as msgpack, never pickle: a child that runs model-written code cannot make the parent run
code by what it writes to the pipe. So the result must be msgpack data (numbers, str, bytes,
lists, str-keyed maps; tuples come back as lists, numpy scalars as Python numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import msgpack

from envrl.process import set_parent_death_signal

_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


class ForkedCallError(RuntimeError):
    """The function failed in the child; `type_name` and `child_traceback` say how."""

    def __init__(self, type_name: str, message: str, child_traceback: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.child_traceback = child_traceback


def _slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _SLOTS:
        _SLOTS[loop] = asyncio.Semaphore(os.cpu_count() or 1)
    return _SLOTS[loop]


def _plain(value: Any) -> Any:
    """msgpack's fallback for types it does not know: numpy scalars and the like become Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    raise TypeError(f"cannot send a {type(value).__name__} back from the forked child (use numbers, str, lists, maps)")


def _child(fn: Callable[[], Any], fd: int) -> None:
    """Runs in the child: never returns, never runs the parent's cleanup code."""
    set_parent_death_signal(signal.SIGKILL)  # die with the parent, even when it is SIGKILLed
    signal.set_wakeup_fd(-1)  # signals to the child must not wake the parent's event loop
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        try:
            payload = msgpack.packb(["ok", fn()], default=_plain)
        except BaseException as e:  # noqa: BLE001 - everything fn raises (or an unsendable result) goes back to the parent
            error = [type(e).__name__, str(e) or repr(e), "".join(traceback.format_exception(e))]
            payload = msgpack.packb(["error", error])
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(0)


async def _read_to_eof(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    while True:
        ready = loop.create_future()
        loop.add_reader(fd, lambda fut=ready: fut.done() or fut.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _kill_and_reap(pid: int) -> int | None:
    """Exit status of the child (None if someone else reaped it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


async def run_forked(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` in a forked child with a deadline of `timeout` seconds from the child's start."""
    async with _slots():
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(fn, write_fd)
        os.close(write_fd)
        try:
            data = await asyncio.wait_for(_read_to_eof(read_fd), timeout)
        finally:
            status = _kill_and_reap(pid)
            os.close(read_fd)
    if not data:
        raise ForkedCallError("ChildDied", f"the child process died before answering (wait status {status})", "")
    try:
        kind, value = msgpack.unpackb(data, raw=False)
        if kind == "error":
            type_name, message, child_traceback = (str(part) for part in value)
    except Exception as e:  # noqa: BLE001 - whatever the child wrote, the parent only reads data
        raise ForkedCallError(
            "BadAnswer", f"the child's answer is not a msgpack [kind, value] pair ({type(e).__name__}: {e})", ""
        ) from None
    if kind == "error":
        raise ForkedCallError(type_name, message, child_traceback)
    if kind != "ok":
        raise ForkedCallError("BadAnswer", f"the child's answer has kind {kind!r}, not 'ok' or 'error'", "")
    return value
