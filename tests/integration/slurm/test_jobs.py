"""`rl --slurm` jobs under the box's SLURM: the smoke run over 3 hosts learns with each process
on its host's own address, and `nobody` on another host gets nothing from its servers; servers SIGKILLed on other hosts heal as under `rl`, scancel leaves
nothing on any host and `rl --resume --slurm` finishes the run with every step trained once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from statistics import fmean

from scripts.slurm_box.box import environ
from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import (
    kill_in_host,
    listeners,
    newest_batch,
    run_pids,
    submit,
    wait_job,
    wait_until,
    write_job,
)
from tests.support.chaos_runs import ROOT, check_unique_lines
from tests.support.run_files import metric_lines

INFERENCE, TRAIN_ENV = "envrl.inference.main", "envs/train/learnable.toml"


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def job_log(out: Path, job: int) -> str:
    return (out / "logs" / f"slurm-{job}.out").read_text(errors="replace")


def test_the_smoke_job_learns_on_three_hosts_each_process_on_its_own_address(cluster: Box, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    job = submit(cluster, write_job(out))
    wait_until("batch 5 published", lambda: newest_batch(out) >= 5, 600, (cluster, job))
    bound = {host: listeners(cluster, host) for host in range(cluster.nodes)}
    tried = intrude(
        cluster, 0, f"http://{cluster.address('envrl-node2')}:8000", f"tcp://{cluster.address('envrl-node1')}:5000"
    )
    assert wait_job(cluster, job) == "COMPLETED", job_log(out, job)[-3000:]

    done = summary(out)
    assert (done["status"], done["steps_done"]) == ("success", 40), done
    rewards = [m["train/reward"] for m in metric_lines(out) if "train/reward" in m]
    assert fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.3, rewards
    log = job_log(out, job)
    for host, name in enumerate(cluster.names):  # each host says which it is and what it runs
        assert re.search(rf"host{host} host {host} \({name}, {re.escape(cluster.address(name))}\): ", log), log
    assert f"--host {cluster.address('envrl-node2')} --port 8000" in (out / "logs" / "inference.log").read_text()
    for host, found in bound.items():  # the run's listeners: the host's own address, or loopback
        own = {cluster.address(cluster.names[host]), "127.0.0.1"}
        ours = [(addr, name) for addr, name in found if not name.startswith(("slurm", "srun"))]  # SLURM's own: *
        assert ours and all(addr in own for addr, _ in ours), (host, ours)
    assert [run_pids(cluster, host) for host in range(cluster.nodes)] == [[], [], []], "left running after the job"
    refused = {"models, no key": 401, "completions, no key": 401, "update, no token": 401, "update, guessed token": 401}
    assert tried == {**refused, "env server answers": False}, tried  # another user on host 0 gets nothing


def intrude(box: Box, host: int, inference: str, env: str) -> dict:
    """What `nobody` on node `host` gets from the run's inference server and env server (intruder.py)."""
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    argv = ["nsenter", f"--net=/run/netns/{box.netns(box.names[host])}", *user, sys.executable]
    done = subprocess.run([*argv, "-m", "tests.integration.slurm.intruder", "--inference", inference, "--env", env],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def trained_steps(out: Path) -> list[int]:
    return sorted(m["step"] for m in metric_lines(out) if m.get("process") == "trainer")


def test_a_job_heals_servers_killed_on_other_hosts_scancel_leaves_nothing_and_resume_slurm_finishes(
    cluster: Box, tmp_path: Path
) -> None:
    out, total = tmp_path / "heals", 24
    heal = ["--trainer.weights.transport", "filesystem", "--restarts.max-restarts", "2", "--trainer.ckpt.interval", "4"]
    job = submit(cluster, write_job(out, *heal, "--max-steps", str(total)))
    wait_until("batch 3 published", lambda: newest_batch(out) >= 3, 600, (cluster, job))
    kill_in_host(cluster, 2, INFERENCE, signal.SIGKILL)
    kill_in_host(cluster, 1, TRAIN_ENV, signal.SIGKILL)
    healed = [rf"host{host} recovery: {re.escape(name)} was killed by SIGKILL; back after"
              for host, name in ((2, "inference"), (1, "train env server 'learnable'"))]  # fmt: skip
    wait_until("both back", lambda: all(re.search(h, job_log(out, job)) for h in healed), 300, (cluster, job))
    wait_until("batch 9 published", lambda: newest_batch(out) >= 9, 300, (cluster, job))
    subprocess.run(["scancel", str(job)], env=environ(cluster), check=True)
    assert wait_job(cluster, job) == "CANCELLED"
    wait_until("nothing of the run left", lambda: not any(run_pids(cluster, h) for h in range(cluster.nodes)), 60)
    assert not subprocess.run(["pgrep", "-f", str(out)], capture_output=True).stdout, "a process of the run is left"

    resumed = submit(cluster, write_job(out, "--resume", "--max-steps", str(total), config=None))
    assert wait_job(cluster, resumed) == "COMPLETED", job_log(out, resumed)[-3000:]
    done = summary(out)
    assert (done["status"], done["steps_done"]) == ("success", total), done
    assert trained_steps(out) == list(range(total))  # every step trained once: nothing lost or repeated
    assert [m["step"] for m in metric_lines(out) if "train/reward" in m] == list(range(total))
    check_unique_lines(out)
    assert [run_pids(cluster, host) for host in range(cluster.nodes)] == [[], [], []]
