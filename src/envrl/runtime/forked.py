"""`run_forked(fn, timeout)`: `fn()`'s result, `ForkedCallError` or `TimeoutError`, the child killed with everything it
started at its deadline; answers are msgpack, never pickle (shared children: docs/running.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from envrl.runtime.lifeline import become_subreaper, set_parent_death_signal
from envrl.runtime.process import kill_tree

MAX_SHARED = 64
"""Calls one child runs at most (a bound on how long later calls wait behind slow ones)."""

_NO_ANSWER = object()


class ForkedCallError(RuntimeError):
    """The function failed in the child; `type_name` and `child_traceback` say how."""

    def __init__(self, type_name: str, message: str, child_traceback: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.child_traceback = child_traceback


@dataclass(eq=False)
class _Call:
    fn: Callable[[], Any]
    timeout: float
    shared: bool
    answer: asyncio.Future[Any]


@dataclass(eq=False)
class _Child:
    pid: int
    reaped: bool = False
    stopped: bool = False
    """Killed because one of its calls was cancelled: its unanswered calls run again in a fresh child."""
    status: int | None = None
    """Its wait status once reaped (None if someone else reaped it)."""

    def kill_and_reap(self) -> None:
        """SIGKILL the child and every process it started, daemons included (module docstring)."""
        if self.reaped:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)  # it starts no more processes and reaps none
            kill_tree(self.pid)
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            self.status = os.waitpid(self.pid, 0)[1]
        self.reaped = True


def _plain(value: Any) -> Any:
    """msgpack's fallback for types it does not know: numpy scalars and the like become Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    raise TypeError(f"cannot send a {type(value).__name__} back from the forked child (use numbers, str, lists, maps)")


def _answer(fn: Callable[[], Any]) -> bytes:
    try:
        return msgpack.packb(["ok", fn()], default=_plain)
    except BaseException as e:  # noqa: BLE001 - everything fn raises (or an unsendable result) goes back to the parent
        return msgpack.packb(["error", [type(e).__name__, str(e) or repr(e), "".join(traceback.format_exception(e))]])


def _child(fns: list[Callable[[], Any]], fd: int) -> None:
    """Runs in the child: answers each function in order; never returns, never runs the parent's cleanup code."""
    set_parent_death_signal(signal.SIGKILL)  # die with the parent, even when it is SIGKILLed
    become_subreaper()  # what fn starts stays our descendant: kill_tree finds it, however it detached
    signal.set_wakeup_fd(-1)  # signals to the child must not wake the parent's event loop
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        with os.fdopen(fd, "wb") as pipe:
            for fn in fns:
                pipe.write(_answer(fn))
                pipe.flush()
    finally:
        kill_tree(os.getpid())  # nothing fn started outlives its answer
        os._exit(0)


class _Answers:
    """The child's answers, one msgpack object each, read from the pipe without blocking the loop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.unpacker = msgpack.Unpacker(raw=False)

    async def next(self) -> Any:
        """The next answer, or `_NO_ANSWER` at end of file (the child exited or died)."""
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(StopIteration):
                return next(self.unpacker)
            ready = loop.create_future()
            loop.add_reader(self.fd, lambda fut=ready: fut.done() or fut.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(self.fd)
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return _NO_ANSWER
            self.unpacker.feed(chunk)


def _result(answer: Any) -> Any:
    """`fn()`'s value from one answer, or the ForkedCallError it stands for."""
    try:
        kind, value = answer
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


def _settle(call: _Call, answer: Any) -> None:
    """`call`'s caller gets the value `answer` carries (or its failure), unless it stopped waiting."""
    try:
        value = _result(answer)
    except ForkedCallError as e:
        _fail(call, e)
        return
    if not call.answer.done():
        call.answer.set_result(value)


def _fail(call: _Call, error: Exception) -> None:
    if not call.answer.done():
        call.answer.set_exception(error)


class _Forker:
    """One event loop's calls: a queue, and up to `slots` children each running a share of it."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.queue: deque[_Call] = deque()
        self.held: dict[_Call, _Child] = {}
        self.children = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def call(self, fn: Callable[[], Any], timeout: float, shared: bool) -> Any:
        call = _Call(fn, timeout, shared, asyncio.get_running_loop().create_future())
        self.queue.append(call)
        self._start()
        try:
            return await call.answer
        except asyncio.CancelledError:
            self._drop(call)
            raise

    def _drop(self, call: _Call) -> None:
        """A cancelled call: out of the queue, or its child killed (its other calls run again)."""
        child = self.held.get(call)
        if call.answer.done() and not call.answer.cancelled():
            return  # answered before the cancellation reached its caller
        if child is None:
            with contextlib.suppress(ValueError):
                self.queue.remove(call)
        elif not child.reaped:
            child.stopped = True
            child.kill_and_reap()

    def _start(self) -> None:
        while self.children < self.slots and self.queue:
            calls = [self.queue.popleft()]
            if calls[0].shared:
                shared = [c for c in self.queue if c.shared]
                share = min(-(-(len(shared) + 1) // self.slots), MAX_SHARED)  # an even split keeps every slot busy
                for call in shared[: share - 1]:
                    self.queue.remove(call)
                    calls.append(call)
            self.children += 1
            task = asyncio.get_running_loop().create_task(self._run(calls))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _fork(self, calls: list[_Call]) -> tuple[int, int] | None:
        """A child forked to run `calls` and the pipe it answers on; None when none could be forked."""
        try:
            read_fd, write_fd = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(read_fd)
                os.close(write_fd)
                raise
        except OSError as e:  # out of processes or descriptors: these calls fail, the queue goes on
            for call in calls:
                _fail(call, e)
            self.children -= 1
            self._start()
            return None
        if pid == 0:
            os.close(read_fd)
            _child([c.fn for c in calls], write_fd)
        os.close(write_fd)
        return pid, read_fd

    async def _run(self, calls: list[_Call]) -> None:
        """Fork one child for `calls` and settle each from its answer, in order, each within its timeout."""
        forked = self._fork(calls)
        if forked is None:
            return
        pid, read_fd = forked
        child = _Child(pid)
        self.held.update(dict.fromkeys(calls, child))
        left = deque(calls)
        shutting_down = False
        try:
            answers = _Answers(read_fd)
            while left:
                try:
                    answer = await asyncio.wait_for(answers.next(), left[0].timeout)
                except TimeoutError:
                    call = left.popleft()
                    _fail(call, TimeoutError(f"the forked call ran past its {call.timeout}s timeout"))
                    break
                except Exception as e:  # noqa: BLE001 - bytes that are not msgpack: this call's answer is bad
                    message = f"the child's answer is not msgpack ({type(e).__name__}: {e})"
                    _fail(left.popleft(), ForkedCallError("BadAnswer", message, ""))
                    break
                if answer is not _NO_ANSWER:
                    _settle(left.popleft(), answer)
                    continue
                child.kill_and_reap()
                if not child.stopped:
                    message = f"the child process died before answering (wait status {child.status})"
                    _fail(left.popleft(), ForkedCallError("ChildDied", message, ""))
                break
        except asyncio.CancelledError:  # the loop is shutting down: so are the callers
            shutting_down = True
            for call in left:
                call.answer.cancel()
            raise
        finally:
            child.kill_and_reap()
            os.close(read_fd)
            for call in calls:
                self.held.pop(call, None)
            self.queue.extendleft(reversed([c for c in left if not c.answer.done()]))
            self.children -= 1
            if not shutting_down:
                self._start()


_FORKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Forker] = weakref.WeakKeyDictionary()


async def run_forked(fn: Callable[[], Any], timeout: float, *, shared: bool = False) -> Any:
    """`fn()` in a forked child with a deadline of `timeout` seconds of its own running time;
    `shared`: the child may run other shared calls before and after it (module docstring)."""
    loop = asyncio.get_running_loop()
    if loop not in _FORKERS:
        _FORKERS[loop] = _Forker(os.cpu_count() or 1)
    return await _FORKERS[loop].call(fn, timeout, shared)
