"""End to end: `rl` on the CPU smoke config learns and survives nothing it started. (Its resume:
test_recovery.py, on a copy of the same run; faults injected into whole runs: test_chaos.py; a
SIGKILL of `rl` mid-run taking every process of its run down: test_rl_distributed.py's 2-rank run,
and every entry point dying with its parent while it still imports: test_lifeline.py.)

Every `rl` run here carries a unique marker in its environment, which all of its descendants
inherit; "nothing left running" means no process with that marker exists once `rl` is gone.
"""

from __future__ import annotations

import re
from pathlib import Path
from statistics import fmean

from tests.support.run_files import metric_lines
from tests.support.smoke import FinishedRun, run_to_end


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


def test_an_env_server_that_cannot_load_stops_rl_and_the_servers_started_beside_it(tmp_path: Path) -> None:
    """Env servers start side by side: the broken one fails its start, `rl` exits 1 naming it, and
    the servers begun with it (the good train env's, the eval env's) go down with the run. (Without
    `abandon` they would too, a moment later, through their parent-death signal when `rl` exits.)"""
    envs = '[{"id": "learnable", "args": {"num_train": 256, "num_eval": 32}}, {"id": "no_such_module:load_env", "name": "broken"}]'
    run = run_to_end(tmp_path / "run", "--orchestrator.envs", envs, timeout=300)
    assert run.code == 1, run.console[-3000:]
    assert "train env server 'broken'" in run.console and "before reporting ready" in run.console
    assert not run.survivors, f"processes of the run survived it: {run.survivors}"
