"""A run that dies says so: when a process of an `rl` run is killed, `summary.json` (strict JSON)
names it and its exit code, and the report written after it opens with the failure box."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import NoReturn

from envrl.report.headline import headline
from tests.support.chaos_runs import RlRun


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"summary.json holds {name}, which is not JSON")


def test_a_killed_trainer_is_named_in_summary_json_and_the_report(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    with RlRun(out, "--max-steps", "20", "--restarts.max-restarts", "0", report=True) as run:  # else it comes back
        run.wait_until("step 1", lambda: run.steps_done() >= 1)
        [trainer] = run.pids("envrl.trainer.main")
        os.kill(trainer, signal.SIGKILL)
        assert run.finish(300) == 1, run.tail()
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert summary["status"] == "failed" and summary["reason"] == "process failed"
    assert summary["failed_process"] == "trainer" and summary["exit_code"] == -signal.SIGKILL
    assert summary["failed_log"] == str(out / "logs" / "trainer.log")
    assert summary["steps_done"] < 20 and summary["train_reward"]["first"] is not None
    failure = headline(out)["failure"]
    assert failure["process"] == "trainer" and failure["exit_code"] == -signal.SIGKILL
    assert '"process":"trainer"' in (out / "report" / "index.html").read_text()
