"""The trainer under torchrun, started as `rl` starts it: its ranks die with `rl` and with torchrun,
and a 2-rank `rl` run publishes the weights one process trains from the same rollouts.

The 2-rank run also has two inference replicas (`placement.inference.replicas = 2`): both serve
rollouts and load every step's weights. What the replicas did is read from their own logs (their
access log and the reload plugin's line), not from the orchestrator; that no rollout used a stale
policy is read from the trainer's mismatch KL (on-policy, a rollout sampled by a replica still on
the old weights would show as a mismatch; the step-0 level is < 1e-3). One `rl` run for both.

The weight comparison replays the 2-rank run's own published batches through a 1-process trainer
of the same config, so both see the very same rollouts by construction (no reliance on vLLM's
seeded sampling repeating across runs). As in test_trainer_distributed.py, `optim.eps = 1` with
`lr = 1` keeps Adam from amplifying the fp32 rounding of differently ordered gradient sums (its
first steps move a weight by about lr * sign(g) otherwise), while a wrong gradient (a rank's
samples dropped or counted twice) still moves weights by ~1e-3, far beyond the 1e-5 bound.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from envrl.config import config_to_toml, load_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from tests.support.chaos_runs import MARKER, ROOT, marked_pids
from tests.support.layout_parity import assert_trained_as_one_process
from tests.support.ports import free_base_port
from tests.support.run_files import metric_lines
from tests.support.smoke import finish, rl_process, wait_no_survivors
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

STEPS = 3
MAX_KL = 1e-3
"""Mismatch KL of an on-policy step whose rollouts the trainer's own weights sampled (step 0: < 1e-3)."""
RELOADED = re.compile(r"weights reloaded from (\S+)/step_(\d+) in")
PARENT = """
import sys, time
from pathlib import Path
from envrl.launcher.plan.commands import trainer_argv
from envrl.runtime.process import spawn
spawn(trainer_argv(sys.executable, 2, Path(sys.argv[1])), name="trainer", log_file=Path(sys.argv[2]))
print("spawned", flush=True)
time.sleep(3600)
"""
"""A stand-in for `rl`: starts the 2-rank trainer command exactly as `rl` does, then waits to be killed."""


def rank_pids(marker: str) -> list[int]:
    """Marked processes that are torchrun ranks (torchrun's own command line names the rank module too)."""
    ranks = []
    for pid in marked_pids(marker):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"envrl.runtime.guarded" in cmdline and b"envrl.launcher.torchrun" not in cmdline:
            ranks.append(pid)
    return ranks


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.2)


def start_parent(tmp_path: Path, marker: str) -> subprocess.Popen[bytes]:
    """The stand-in `rl` with a trainer that waits for batches that never come (it stays alive)."""
    trainer = TrainerConfig(output_dir=tmp_path / "out", batch_timeout_s=3600)
    trainer.model.name = str(DEFAULT_DIR)
    trainer.wandb.mode = "disabled"
    config = tmp_path / "trainer.toml"
    config.write_text(config_to_toml(trainer))
    env = {**os.environ, MARKER: marker, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", PARENT, str(config), str(tmp_path / "trainer.log")]
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def kill_marked(marker: str) -> None:
    for pid in marked_pids(marker):
        os.kill(pid, signal.SIGKILL)


def test_sigkill_of_the_launcher_takes_torchrun_and_every_rank_down(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    parent = start_parent(tmp_path, marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2, 180, "torchrun to start 2 ranks")
        parent.kill()
        parent.wait()
        survivors = wait_no_survivors(marker, timeout=60)
        assert not survivors, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        parent.kill()
        kill_marked(marker)


def test_ranks_die_with_torchrun_even_while_they_start(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    parent = start_parent(tmp_path, marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2, 180, "torchrun to start 2 ranks")
        ranks = rank_pids(marker)
        [torchrun] = [pid for pid in marked_pids(marker) if pid not in ranks and pid != parent.pid]
        os.kill(torchrun, signal.SIGKILL)  # no SIGTERM handler runs: the ranks are on their own
        wait_for(lambda: not set(ranks) & set(marked_pids(marker)), 120, f"ranks {ranks} to die")
    finally:
        parent.kill()
        kill_marked(marker)


def check_every_replica_served_rollouts_and_loaded_every_steps_weights(out: Path) -> None:
    """Replicas 0 and 1 each loaded policies 1, 2, ... in order (at least up to STEPS - 1) and
    served rollouts; the first STEPS steps were sampled on-policy; no single server's log."""
    logs = out / "logs"
    for replica in ("inference-0", "inference-1"):
        log = (logs / f"{replica}.log").read_text()
        reloads = [(Path(path), int(step)) for path, step in RELOADED.findall(log)]
        assert len(reloads) >= STEPS - 1, (replica, reloads)  # rl was killed once weights/step_STEPS appeared
        assert reloads == [((out / "weights").resolve(), step) for step in range(1, len(reloads) + 1)], (
            replica,
            reloads,
        )
        assert log.count('"POST /inference/v1/generate HTTP/1.1" 200') > 0, f"{replica} served no rollout"
    assert not (logs / "inference.log").exists()
    kls = sorted((m["step"], m["trainer/mismatch_kl"]) for m in metric_lines(out) if "trainer/mismatch_kl" in m)
    assert [step for step, _ in kls[:STEPS]] == list(range(STEPS)), kls
    assert all(abs(kl) < MAX_KL for _, kl in kls[:STEPS]), kls
    assert f"all 2 inference replicas now serve policy {STEPS - 1}" in (logs / "orchestrator.log").read_text()


def test_two_rank_rl_run_with_two_replicas_publishes_the_weights_one_process_trains_and_dies_with_rl(
    tmp_path: Path,
) -> None:
    out = tmp_path / "two"
    overrides = {
        "placement.trainer.num-procs": "2",
        "placement.inference.replicas": "2",
        "inference.port": str(free_base_port()),  # base and base + 1 are free
        "max-steps": "100",  # still training when killed below; the lr schedule is constant
        "max-async-level": "0",
        "trainer.optim.lr": "1.0",
        "trainer.optim.eps": "1.0",
        "trainer.ckpt.interval": "0",
        "orchestrator.batch-size": "8",
        "orchestrator.eval.env": "[]",
    }
    with rl_process(out, *[arg for key, value in overrides.items() for arg in (f"--{key}", value)]) as (proc, marker):

        def published() -> bool:
            assert proc.poll() is None, finish(proc, 10)[1][-3000:]
            return (out / "weights" / f"step_{STEPS}").is_dir()

        wait_for(published, 900, f"weights/step_{STEPS}")
        assert len(rank_pids(marker)) == 2
        # rl, 2 inference replicas (+ vLLM engines), the env server (+ its worker), torchrun, its 2 ranks, orchestrator
        assert len(marked_pids(marker)) > 5
        proc.kill()  # SIGKILL of rl mid-run
        proc.wait()
        survivors = wait_no_survivors(marker, timeout=60)
        assert not survivors, [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in survivors]
    check_every_replica_served_rollouts_and_loaded_every_steps_weights(out)

    one = tmp_path / "one"
    for step in range(STEPS):
        shutil.copytree(out / "rollouts" / f"step_{step}", one / "rollouts" / f"step_{step}")
    config = load_config(
        TrainerConfig,
        [
            *("--config", str(out / "configs" / "trainer.toml"), "--output-dir", str(one)),
            *("--max-steps", str(STEPS), "--wandb.mode", "disabled"),
        ],
        prog="trainer",
    )
    assert "num_procs" not in (out / "configs" / "trainer.toml").read_text()  # the launcher's key, not the trainer's
    Trainer(config, init_runtime(config)).run()

    assert_trained_as_one_process(out, one, STEPS)
