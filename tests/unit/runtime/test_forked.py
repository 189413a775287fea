"""run_forked: the child's answer is read as msgpack data, so what a child writes cannot run code in the parent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envrl.runtime.forked import ForkedCallError, run_forked
from tests.support.env_servers import alive, wait_until


def forked(fn: Any) -> Any:
    return asyncio.run(run_forked(fn, timeout=30))


class _Planted:
    """Unpickling it creates `path`: proof that the parent ran code the child chose."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_numbers_lists_and_maps_come_back_and_numpy_scalars_as_python_numbers() -> None:
    assert forked(lambda: [1.5, {"a": [1, "x"]}, None, True]) == [1.5, {"a": [1, "x"]}, None, True]
    value = forked(lambda: [np.float64(0.25), np.int64(3)])
    assert value == [0.25, 3] and type(value[0]) is float and type(value[1]) is int


def test_a_result_that_is_not_data_is_a_forked_call_error_naming_its_type() -> None:
    with pytest.raises(ForkedCallError) as raised:
        forked(lambda: object())
    assert raised.value.type_name == "TypeError" and "object" in str(raised.value)


def test_a_failure_in_the_child_comes_back_with_its_type_and_traceback() -> None:
    def fail() -> None:
        raise ValueError("no luck")

    with pytest.raises(ForkedCallError) as raised:
        forked(fail)
    assert (
        raised.value.type_name == "ValueError"
        and str(raised.value) == "no luck"
        and "fail" in raised.value.child_traceback
    )


def test_a_pickle_written_by_the_child_is_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "code ran in the parent"

    def write_pickle_and_exit() -> None:
        """What code in the child can do: write its own bytes to the answer pipe (the caller's `fd`)."""
        frame = sys._getframe(1)
        while "fd" not in frame.f_locals:
            frame = frame.f_back
        os.write(frame.f_locals["fd"], pickle.dumps(_Planted(marker)))
        os._exit(0)

    with pytest.raises(ForkedCallError) as raised:
        forked(write_pickle_and_exit)
    assert raised.value.type_name == "BadAnswer"
    assert not marker.exists()


def _pid_and(value: int) -> Any:
    return lambda: [os.getpid(), value]


def _spinner(pid_file: Path) -> Any:
    def spin() -> None:
        pid_file.write_text(str(os.getpid()))
        while True:
            pass

    return spin


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


SPINNER = 3
"""Of 12 calls started together on 2 slots, calls 0 and 1 get a child each; the first to finish
takes half of the 10 waiting (2-6), so the spinner shares its child with calls before and after it."""


def _check_spinner_shared_and_stopped(answers: list[Any], spinner_pid: int) -> None:
    others = [answer for i, answer in enumerate(answers) if i != SPINNER]
    assert [value for _, value in others] == [i for i in range(12) if i != SPINNER]
    if os.cpu_count() == 2:
        assert answers[2][0] == spinner_pid  # ran before it in its child
        assert answers[SPINNER + 1][0] != spinner_pid  # after it: ran again in a fresh child
    assert _gone(spinner_pid)


def test_calls_waiting_together_share_a_child_and_each_gets_its_own_answer() -> None:
    async def main() -> list[Any]:
        return await asyncio.gather(*(run_forked(_pid_and(i), timeout=30, shared=True) for i in range(20)))

    answers = asyncio.run(main())
    assert [value for _, value in answers] == list(range(20))
    assert len({pid for pid, _ in answers}) < 20 and os.getpid() not in {pid for pid, _ in answers}


def test_calls_not_marked_shared_each_run_in_a_child_of_their_own() -> None:
    async def main() -> list[Any]:
        shared = [run_forked(_pid_and(i), timeout=30, shared=True) for i in range(10)]
        alone = [run_forked(_pid_and(i), timeout=30) for i in range(10, 20)]
        return await asyncio.gather(*(c for pair in zip(alone, shared, strict=True) for c in pair))

    answers = asyncio.run(main())
    alone_pids = [pid for pid, value in answers if value >= 10]
    shared_pids = {pid for pid, value in answers if value < 10}
    assert len(set(alone_pids)) == 10 and not shared_pids & set(alone_pids)
    assert len(shared_pids) < 10


def test_a_call_that_times_out_is_killed_and_the_calls_sharing_its_child_still_answer(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fns = [_pid_and(i) for i in range(12)]
    fns[SPINNER] = _spinner(pid_file)

    async def main() -> list[Any]:
        timeouts = [0.5 if i == SPINNER else 30 for i in range(12)]
        calls = (run_forked(fn, timeout, shared=True) for fn, timeout in zip(fns, timeouts, strict=True))
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[SPINNER], TimeoutError)
    _check_spinner_shared_and_stopped(answers, int(pid_file.read_text()))


def test_a_cancelled_call_is_killed_and_the_calls_sharing_its_child_still_answer(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fns = [_pid_and(i) for i in range(12)]
    fns[SPINNER] = _spinner(pid_file)

    async def main() -> list[Any]:
        calls = [asyncio.ensure_future(run_forked(fn, timeout=60, shared=True)) for fn in fns]
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.01)
        calls[SPINNER].cancel()
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[SPINNER], asyncio.CancelledError)
    _check_spinner_shared_and_stopped(answers, int(pid_file.read_text()))


def _start_daemon_then(pid_file: Path, hang: bool) -> None:
    """Starts a daemon (double fork + setsid, as a reward function's server might) that records its pid."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
            os.rename(pid_file.with_suffix(".tmp"), pid_file)
            while True:
                signal.pause()
        os._exit(0)
    while not pid_file.exists():
        time.sleep(0.01)
    while hang:
        time.sleep(1)


@pytest.mark.parametrize("hang", [True, False], ids=["timed-out", "answered"])
def test_a_daemon_the_function_started_is_killed_with_its_child(tmp_path: Path, hang: bool) -> None:
    pid_file = tmp_path / "daemon.pid"
    try:
        if hang:
            with pytest.raises(TimeoutError):
                asyncio.run(run_forked(lambda: _start_daemon_then(pid_file, hang=True), timeout=2))
        else:
            assert forked(lambda: _start_daemon_then(pid_file, hang=False)) is None
        daemon = int(pid_file.read_text())
        wait_until(lambda: not alive(daemon), 10, f"daemon {daemon} died")
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
