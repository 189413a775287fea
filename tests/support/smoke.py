"""`rl` runs on the CPU smoke config for the integration tests, and the one 40-step smoke run
that test_rl.py and test_report.py share (started once per session, under the heavy lock the
caller holds).
Runs leave out the end-of-run report (`--no-report`, seconds of plotting each) unless the test
reads it (`report=True`).

Every `rl` run here carries a unique marker in its environment, which all of its descendants
inherit; "nothing left running" means no process with that marker exists once `rl` is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.chaos_runs import MARKER, ROOT, SMOKE, marked_pids
from tests.support.ports import free_base_port, free_port


@contextmanager
def rl_process(
    out: Path, *overrides: str, config: Path = SMOKE, report: bool = False, environ: Mapping[str, str] = os.environ
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start `rl` on `config` (the smoke config) in `out` with `environ` (this process's environment);
    on exit make sure it and all it started are gone."""
    marker = uuid.uuid4().hex
    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(config),
        "--output-dir", str(out), "--inference.port", str(free_port()),
        "--env-server-base-port", str(free_base_port()), *([] if report else ["--no-report"]), *overrides,
    ]  # fmt: skip
    env = {**environ, MARKER: marker, "WANDB_MODE": "offline"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield proc, marker
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in marked_pids(marker):
            os.kill(pid, signal.SIGKILL)


def finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(errors="replace")


def wait_no_survivors(marker: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := marked_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@dataclass(frozen=True)
class FinishedRun:
    """An `rl` run waited for to its end, and then for its processes to be gone."""

    out: Path
    code: int
    console: str
    """Everything `rl` printed (stdout and stderr, not a TTY)."""
    survivors: list[int]
    """Marked processes still alive `survivors_timeout` s after `rl` exited (should be none)."""
    seen: Any = None
    """What the `while_running` of `run_to_end` returned."""

    def check(self, survivors_note: str = "processes of the run survived it") -> None:
        """The run exited 0 and left nothing running."""
        assert self.code == 0, self.console[-3000:]
        assert not self.survivors, f"{survivors_note}: {self.survivors}"


def run_to_end(
    out: Path,
    *overrides: str,
    config: Path = SMOKE,
    timeout: float = 1500,
    survivors_timeout: float = 10.0,
    report: bool = False,
    environ: Mapping[str, str] = os.environ,
    while_running: Callable[[subprocess.Popen[bytes], str], Any] = lambda proc, marker: None,
) -> FinishedRun:
    """`rl` on `config` in `out` with `overrides`, to its end; its console is also written beside
    `out` (`<name>-console.txt`) for a failure's post-mortem. `while_running(proc, marker)` is
    called once `rl` has started (it must not raise); what it returns is the run's `seen`."""
    with rl_process(out, *overrides, config=config, report=report, environ=environ) as (proc, marker):
        seen = while_running(proc, marker)
        code, console = finish(proc, timeout=timeout)
        survivors = wait_no_survivors(marker, survivors_timeout)
    (out.parent / f"{out.name}-console.txt").write_text(console)
    return FinishedRun(out, code, console, survivors, seen)


def run_smoke(
    out: Path,
    environ: Mapping[str, str] = os.environ,
    while_running: Callable[[subprocess.Popen[bytes], str], Any] = lambda proc, marker: None,
) -> FinishedRun:
    """The whole smoke config (40 steps) in `out`, to its end, with its report (test_report.py
    reads it); `environ` and `while_running` as for `run_to_end`."""
    return run_to_end(out, report=True, environ=environ, while_running=while_running)
