"""Every host's restarts and failure reach `summary.json`: a host without the orchestrator publishes its supervisor's
recoveries as they happen (`data/host_recoveries.py`), and the host that writes the summary merges them."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from envrl.data import host_recoveries
from envrl.data.layout import host_recoveries_file
from envrl.launcher import summary
from envrl.runtime.atomic import atomic_write_text
from envrl.runtime.process import Child, spawn
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor
from tests.unit.runtime.test_supervisor import watch_while

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
KILLED = {"exit": "was killed by SIGKILL", "back": True}


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30.0
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within 30 s"
        time.sleep(0.02)


def _published(out: Path, host: int) -> dict[str, Any]:
    path = host_recoveries_file(out, host)
    return json.loads(path.read_text()) if path.exists() else {}


def _faults(out: Path, host: int, name: str) -> list[dict[str, Any]]:
    return _published(out, host).get("recoveries", {}).get(name, {}).get("faults", [])


def test_a_hosts_restart_is_published_at_the_death_and_again_when_it_is_back(tmp_path: Path) -> None:
    out, back, done = tmp_path / "run", tmp_path / "back", tmp_path / "done"
    out.mkdir(mode=0o700)
    waiter = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.02)"]

    def start() -> Child:
        return spawn(SLEEP, name="inference-1")

    supervisor = Supervisor(grace=1.0, on_recovery=partial(host_recoveries.write, out, 2))
    supervisor.add(start(), Respawn(start, RestartPolicy(backoff_s=0.0), back=lambda: back.exists))
    supervisor.add(spawn(waiter, name="train env server 'x'"))
    first = supervisor.children[0].pid

    def kill_then_finish() -> None:
        os.kill(first, signal.SIGKILL)
        _wait(lambda: len(_faults(out, 2, "inference-1")) == 1, "fault in host 2's file")
        [fault] = _faults(out, 2, "inference-1")
        assert not fault["back"]  # published at the death, open
        back.touch()
        _wait(lambda: _faults(out, 2, "inference-1")[0]["back"], "recovery in host 2's file")
        done.touch()

    watch_while(supervisor, kill_then_finish, until="train env server 'x'")
    assert host_recoveries_file(out, 2).stat().st_mode & 0o077 == 0  # its user's only, as the run dir
    published = _published(out, 2)
    assert published["host"] == 2 and published["recoveries"] == supervisor.recoveries()

    trainer = {"restarts": 1, "seconds_lost": 3.0, "faults": [{**KILLED, "seconds_lost": 3.0}]}
    merged = host_recoveries.gather(out, 0, {"trainer": trainer})
    assert merged == {
        "trainer": {**trainer, "host": 0},
        "inference-1": {**published["recoveries"]["inference-1"], "host": 2},
    }
    done_ = summary.Outcome(status="success", reason="completed")
    assert json.loads(summary.write(out, [], done_, 1.0, merged).read_text())["recoveries"] == merged


def test_a_fault_still_open_in_a_hosts_file_counts_to_when_the_summary_is_written(tmp_path: Path) -> None:
    """As the summary's own host counts its open faults: to now, not to when the other host last wrote."""
    open_fault = {"exit": "was killed by SIGKILL", "seconds_lost": 1.0, "back": False}
    recoveries = {
        "inference": {"restarts": 2, "seconds_lost": 5.0, "faults": [{**KILLED, "seconds_lost": 4.0}, open_fault]}
    }
    snapshot = {"host": 1, "written_at": time.time() - 100.0, "recoveries": recoveries}
    atomic_write_text(host_recoveries_file(tmp_path, 1), json.dumps(snapshot), private=True)
    entry = host_recoveries.gather(tmp_path, 0, {})["inference"]
    first, last = entry["faults"]
    assert entry["host"] == 1 and entry["restarts"] == 2
    assert first["seconds_lost"] == 4.0 and last["seconds_lost"] >= 101.0 and not last["back"]
    assert entry["seconds_lost"] == first["seconds_lost"] + last["seconds_lost"]


def test_an_unreadable_hosts_file_leaves_the_others_in_the_summary(tmp_path: Path) -> None:
    env_server = {"restarts": 1, "seconds_lost": 2.0, "faults": [{**KILLED, "seconds_lost": 2.0}]}
    host_recoveries.write(tmp_path, 1, {"train env server 'x'": env_server})
    atomic_write_text(host_recoveries_file(tmp_path, 2), '{"host": 2, "recov', private=True)  # cut short
    assert host_recoveries.gather(tmp_path, 0, {}) == {"train env server 'x'": {**env_server, "host": 1}}


def test_the_failure_of_the_lowest_failed_host_is_the_jobs(tmp_path: Path) -> None:
    """The host writing the summary is stopped because another failed: the summary says which."""
    assert host_recoveries.failure(tmp_path) is None
    host_recoveries.write(tmp_path, 1, {})  # restarts only
    assert host_recoveries.failure(tmp_path) is None
    failed = [
        summary.Outcome(status="failed", reason=f"process failed on host {h}", failed_process="p") for h in (2, 1)
    ]
    host_recoveries.write(tmp_path, 2, {}, failed[0])
    host_recoveries.write(tmp_path, 1, {}, failed[1])
    assert host_recoveries.failure(tmp_path) == failed[1]
    host_recoveries.clear(tmp_path)  # the next job's first step
    assert host_recoveries.failure(tmp_path) is None
