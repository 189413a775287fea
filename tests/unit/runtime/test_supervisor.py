"""The supervisor brings a dead process back and says what the death cost (`Supervisor.recoveries`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from envrl.runtime.process import Child, spawn
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30.0
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within 30 s"
        time.sleep(0.02)


def _worker_and_trainer(tmp_path: Path) -> tuple[Supervisor, Path, Path]:
    """A restartable "worker" that is back once `back` exists, and a "trainer" that ends once
    `done` exists: (supervisor, back, done)."""
    back, done = tmp_path / "back", tmp_path / "done"
    waiter = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.02)"]

    def start() -> Child:
        return spawn(SLEEP, name="worker")

    supervisor = Supervisor(grace=1.0)
    supervisor.add(start(), Respawn(start, RestartPolicy(backoff_s=0.0), back=lambda: back.exists))
    supervisor.add(spawn(waiter, name="trainer"))
    return supervisor, back, done


def watch_while(supervisor: Supervisor, action: Callable[[], None], until: str = "trainer") -> None:
    """Watch until the child named `until` ends while `action` runs on another thread; every child
    is stopped however it ends."""
    thread = threading.Thread(target=action)
    thread.start()
    try:
        supervisor.watch(until={until})
    finally:
        thread.join()
        supervisor.stop_all()


def test_a_killed_process_is_restarted_and_its_fault_closes_when_it_is_back(tmp_path: Path) -> None:
    supervisor, back, done = _worker_and_trainer(tmp_path)
    first = supervisor.children[0].pid

    def kill_then_finish() -> None:
        os.kill(first, signal.SIGKILL)
        _wait(lambda: supervisor.children[0].pid != first, "restart")
        assert supervisor.faults[0].seconds_lost is None  # restarted, not back yet
        back.touch()
        _wait(lambda: supervisor.faults[0].seconds_lost is not None, "recovery")
        done.touch()

    watch_while(supervisor, kill_then_finish)
    recoveries = supervisor.recoveries()
    assert list(recoveries) == ["worker"] and recoveries["worker"]["restarts"] == 1
    [fault] = recoveries["worker"]["faults"]
    assert fault["exit"] == "was killed by SIGKILL" and fault["back"] and fault["seconds_lost"] > 0


def test_a_process_that_finishes_while_coming_back_is_back(tmp_path: Path) -> None:
    quick = [sys.executable, "-c", "pass"]

    def start() -> Child:
        return spawn(quick, name="trainer")

    supervisor = Supervisor(grace=1.0)
    supervisor.add(
        spawn(SLEEP, name="trainer"), Respawn(start, RestartPolicy(backoff_s=0.0), back=lambda: lambda: False)
    )
    os.kill(supervisor.children[0].pid, signal.SIGKILL)
    try:
        supervisor.watch(until={"trainer"})
    finally:
        supervisor.stop_all()
    [fault] = supervisor.recoveries()["trainer"]["faults"]
    assert fault["back"]


def test_a_process_killed_again_before_it_was_back_counts_two_faults_one_of_them_not_back(tmp_path: Path) -> None:
    supervisor, back, done = _worker_and_trainer(tmp_path)

    def kill_twice_then_finish() -> None:
        for _ in range(2):
            pid = supervisor.children[0].pid
            os.kill(pid, signal.SIGKILL)
            _wait(lambda pid=pid: supervisor.children[0].pid != pid, "restart")
        back.touch()
        _wait(lambda: len(supervisor.faults) == 2 and supervisor.faults[1].back, "recovery")
        done.touch()

    watch_while(supervisor, kill_twice_then_finish)
    worker = supervisor.recoveries()["worker"]
    assert worker["restarts"] == 2 and [f["back"] for f in worker["faults"]] == [False, True]


def test_watching_until_stopped_restarts_processes_added_meanwhile_from_another_thread() -> None:
    """How the sidecars of a standalone orchestrator and `rl eval` are watched (`envclient/sidecars.py`)."""

    def start() -> Child:
        return spawn(SLEEP, name="env server")

    supervisor, stop = Supervisor(grace=1.0), threading.Event()
    watcher = threading.Thread(target=supervisor.watch, args=(set(),), kwargs={"stop": stop})
    watcher.start()
    try:
        supervisor.add(start(), Respawn(start, RestartPolicy(backoff_s=0.0)))  # added while watching
        first = supervisor.children[0].pid
        os.kill(first, signal.SIGKILL)
        _wait(lambda: supervisor.children[0].pid != first, "restart")
        assert supervisor.restarts() == {"env server": 1}
    finally:
        stop.set()
        watcher.join(timeout=30)
        supervisor.stop_all()
    assert not watcher.is_alive(), "watch returns once stop is set"
