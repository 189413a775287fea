"""Every role recovers by itself, in a resumed run: a copy of the session's finished 40-step smoke
run (`smoke_run`) is refused without `--resume`, then continued with `--resume` for 12 more steps
while its trainer, orchestrator and inference server are each SIGKILLed once; it finishes with
exit 0 and no second `--resume`, its step numbering and metrics continue the run's, every step is
trained and published once, and nothing is left running. (One `rl` stack for both behaviours.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from tests.support.chaos_runs import RlRun, account, check_unique_lines, cmdline
from tests.support.run_files import metric_lines
from tests.support.smoke import FinishedRun, run_to_end, wait_no_survivors


def trained_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return sorted(m["step"] for m in map(json.loads, lines) if m.get("process") == "trainer")


def kill(run: RlRun, part: str) -> int:
    [pid] = run.pids(part)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_resumed_run_continues_its_steps_and_its_killed_trainer_orchestrator_and_inference_come_back(
    smoke_run: FinishedRun, tmp_path: Path
) -> None:
    """Continues a copy of the smoke run (not vLLM's scratch dir: its sockets and cache link belong
    to that run)."""
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    out, done, steps = tmp_path / "recover", 40, 12
    total = done + steps
    shutil.copytree(smoke_run.out, out, ignore=shutil.ignore_patterns("inference"))
    refused = run_to_end(out, "--max-steps", str(total), timeout=60)
    assert refused.code == 2 and "--resume" in refused.console, "an earlier run's output dir needs --resume or --clean"

    with RlRun(out, "--max-steps", str(total), "--trainer.ckpt.interval", "2", "--resume") as run:
        # Each kill leaves steps that need the killed process back, so the run cannot end before it is.
        run.wait_until("batch 2", lambda: run.steps_done() >= done + 2)
        kill(run, "envrl.inference.main")
        run.wait_until("batch 5", lambda: run.steps_done() >= done + 5)
        kill(run, "envrl.trainer.main")
        run.wait_until("batch 8", lambda: run.steps_done() >= done + 8)
        kill(run, "envrl.orchestrator.main")
        assert run.finish(600) == 0, run.tail()
        left = wait_no_survivors(run.marker)
        assert left == [], [cmdline(pid) for pid in left]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success", summary
    recoveries = summary["recoveries"]
    assert {name: r["restarts"] for name, r in recoveries.items()} == {"trainer": 1, "orchestrator": 1, "inference": 1}
    assert all(f["back"] for r in recoveries.values() for f in r["faults"]), recoveries
    assert trained_steps(out) == list(range(total))
    records = metric_lines(out)
    assert [m["step"] for m in records if "train/reward" in m] == list(range(total))
    assert [m["step"] for m in records if "trainer/loss" in m] == list(range(total))
    assert (out / "weights" / f"step_{total}").is_dir()
    check_unique_lines(out)
    assert account(out, "recovery", "trainer, orchestrator, inference").lost == 0
    launcher_log = (out / "logs" / "launcher.log").read_text()
    assert all(f"recovery: {name} was killed by SIGKILL; back after" in launcher_log for name in recoveries)
