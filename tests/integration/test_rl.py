"""End to end: `rl` on the CPU smoke config learns and survives nothing it started. (Its resume:
test_recovery.py, on a copy of the same run; faults injected into whole runs: test_chaos.py.)

Every `rl` run here carries a unique marker in its environment, which all of its descendants
inherit; "nothing left running" means no process with that marker exists once `rl` is gone.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from statistics import fmean

from tests.support.chaos_runs import marked_pids
from tests.support.run_files import metric_lines
from tests.support.smoke import FinishedRun, finish, rl_process, wait_no_survivors


def test_smoke_run_learns_and_leaves_nothing_running(smoke_run: FinishedRun) -> None:
    out, console = smoke_run.out, smoke_run.console
    smoke_run.check()

    rewards = [m["train/reward"] for m in metric_lines(out) if "train/reward" in m]
    assert len(rewards) == 40
    assert fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.3, rewards
    [first_kl] = [m["trainer/mismatch_kl"] for m in metric_lines(out) if m["step"] == 0 and "trainer/mismatch_kl" in m]
    assert abs(first_kl) < 1e-3
    assert "run finished: 40 steps" in console

    expected = [
        "logs/launcher.log", "logs/inference.log", "logs/trainer.log", "logs/orchestrator.log",
        "logs/envs/train/learnable.log", "logs/envs/eval/learnable.log",
        "configs/trainer.toml", "configs/orchestrator.toml", "configs/inference.toml",
        "configs/envs/train/learnable.toml", "configs/envs/eval/learnable.toml",
        "rollouts/train.jsonl", "rollouts/eval/step_0.jsonl", "rollouts/step_39/batch.msgpack",
        "weights/step_40/model.safetensors", "checkpoints/step_40", "rollouts/step_39/orchestrator.json", "metrics.jsonl",
    ]  # fmt: skip
    missing = [path for path in expected if not (out / path).exists()]
    assert not missing


def test_smoke_run_console_prints_a_line_for_every_step(smoke_run: FinishedRun) -> None:
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    lines = re.findall(
        r"^step (\d+) \((\d+)/40\) \| reward learnable \S+ \| eval .* \| ETA \S+$", smoke_run.console, re.M
    )
    assert [(int(step), int(done)) for step, done in lines] == [(s, s + 1) for s in range(40)], smoke_run.console[
        -3000:
    ]


def test_children_die_when_rl_itself_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    with rl_process(out, "--max-steps", "1000") as (proc, marker):
        deadline = time.monotonic() + 900
        while not (out / "logs" / "orchestrator.log").exists():
            assert proc.poll() is None, finish(proc, 10)[1][-3000:]
            assert time.monotonic() < deadline, "the run never started its orchestrator"
            time.sleep(0.5)
        assert (
            len(marked_pids(marker)) > 5
        )  # rl, inference (+ vLLM engine), env servers (+ workers), trainer, orchestrator
        proc.kill()
        proc.wait()
        survivors = wait_no_survivors(marker, timeout=30)
        described = [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in survivors]
        assert not survivors, described
