"""Every role recovers by itself: an `rl` run whose trainer, orchestrator and inference server are
each SIGKILLed once finishes with exit 0 and no `--resume`, every step trained and published once,
and nothing left running."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.chaos_runs import RlRun, account, check_unique_lines, cmdline
from tests.support.smoke import wait_no_survivors


def trained_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return sorted(m["step"] for m in map(json.loads, lines) if m.get("process") == "trainer")


def kill(run: RlRun, part: str) -> int:
    [pid] = run.pids(part)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_trainer_orchestrator_and_inference_come_back_and_the_run_finishes(tmp_path: Path) -> None:
    out, steps = tmp_path / "recover", 12
    with RlRun(out, "--max-steps", str(steps), "--trainer.ckpt.interval", "2") as run:
        # Each kill leaves steps that need the killed process back, so the run cannot end before it is.
        run.wait_until("batch 2", lambda: run.steps_done() >= 2)
        kill(run, "envrl.inference.main")
        run.wait_until("batch 5", lambda: run.steps_done() >= 5)
        kill(run, "envrl.trainer.main")
        run.wait_until("batch 8", lambda: run.steps_done() >= 8)
        kill(run, "envrl.orchestrator.main")
        assert run.finish(600) == 0, run.tail()
        left = wait_no_survivors(run.marker)
        assert left == [], [cmdline(pid) for pid in left]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success", summary
    recoveries = summary["recoveries"]
    assert {name: r["restarts"] for name, r in recoveries.items()} == {"trainer": 1, "orchestrator": 1, "inference": 1}
    assert all(f["back"] for r in recoveries.values() for f in r["faults"]), recoveries
    assert trained_steps(out) == list(range(steps))
    check_unique_lines(out)
    assert account(out, "recovery", "trainer, orchestrator, inference").lost == 0
    launcher_log = (out / "logs" / "launcher.log").read_text()
    assert all(f"recovery: {name} was killed by SIGKILL; back after" in launcher_log for name in recoveries)
