"""`rl --slurm` jobs under the box's SLURM: the smoke run learns over 3 hosts, each process on its host's address, and
`nobody` on any host gets nothing from its servers, files or weight transfer; servers killed on other hosts heal (out of
restarts, end the job, named); the time limit and scancel stop a job cleanly; resumes train every step once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from statistics import fmean

from envrl.data.layout import published_steps, weights_dir, weights_root
from envrl.transport.transfer_files import SECRET_FILE, TRANSFER_FILE
from scripts.slurm_box.box import environ
from scripts.slurm_box.conf import Box
from tests.integration.slurm.jobs import (
    SLURM_SMOKE,
    command_line,
    host_pids,
    kill_in_host,
    listeners,
    near_time_limit,
    newest_batch,
    run_pids,
    submit,
    wait_job,
    wait_until,
    write_job,
)
from tests.support.chaos_runs import ROOT, check_unique_lines
from tests.support.other_user import reachable_dir
from tests.support.run_files import metric_lines

INFERENCE, ORCHESTRATOR, WORKER = "envrl.inference.main", "envrl.orchestrator.main", "envrl.serve.worker"
TRAINER = "envrl.trainer.main"
TRAIN_ENV, EVAL_ENV = "envs/train/learnable.toml", "envs/eval/learnable.toml"
KILLED = ((2, "inference"), (1, "train env server 'learnable'"), (0, "orchestrator"))
"""What the heal job SIGKILLs: (host, process)."""


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def job_log(out: Path, job: int) -> str:
    """The job's output so far ("" before SLURM opens it)."""
    path = out / "logs" / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def test_the_smoke_job_learns_on_three_hosts_and_another_user_on_any_host_gets_nothing(
    cluster: Box, tmp_path: Path
) -> None:
    with reachable_dir() as parent:  # not pytest's private root: the run's own modes must keep it private
        out = parent / "smoke"
        job = submit(cluster, write_job(out))
        wait_until("batch 5 published", lambda: newest_batch(out) >= 5, 600, (cluster, job))
        bound = {host: listeners(cluster, host) for host in range(cluster.nodes)}
        inference, env = f"{cluster.address('envrl-node2')}:8000", f"{cluster.address('envrl-node1')}:5000"
        served = intrude(cluster, 0, "--inference", f"http://{inference}", "--env", f"tcp://{env}")
        with replica_paused_before_a_memory_policy(cluster, out, (cluster, job)):
            transfer = intrude_open_transfer(cluster, out, (cluster, job))
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
            ours = [(addr, name) for addr, _, name in found if not name.startswith(("slurm", "srun"))]  # SLURM's: *
            assert ours and all(addr in own for addr, _ in ours), (host, ours)
        assert [run_pids(cluster, host) for host in range(cluster.nodes)] == [[], [], []], "left running after the job"
        trainer_log = (out / "logs" / "trainer.log").read_text()
    refused = {"models, no key": 401, "completions, no key": 401, "update, no token": 401, "update, guessed token": 401}
    assert served == {**refused, "env server answers": False}, served  # another user on host 0 gets nothing
    # ... and on host 2, beside the replica the policy is for: neither its files nor its transfer
    assert transfer == {"join, guessed proof": "closed", "read, no proof": "closed", "readable": []}, transfer
    assert "rendezvous" in trainer_log and "a client without the secret" in trainer_log


INFERENCE_PROCESSES = (INFERENCE, "VLLM", "vllm")


@contextmanager
def paused(box: Box, host: int, needles: tuple[str, ...]) -> Iterator[list[int]]:
    """SIGSTOP every process on node `host` whose command line holds one of `needles`; SIGCONT at the end."""
    pids = [pid for pid in host_pids(box, host) if any(needle in command_line(pid) for needle in needles)]
    assert pids, f"nothing of {needles} on {box.names[host]}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def open_transfer(box: Box, out: Path) -> tuple[Path, int] | None:
    """The newest policy sent in memory whose rendezvous listens on host 0 now: its directory and port."""
    ports = {port for _, port, _ in listeners(box, 0)}
    for step in reversed(published_steps(weights_root(out))):
        with suppress(OSError, ValueError):
            port = json.loads((weights_dir(out, step) / TRANSFER_FILE).read_text())["port"]
            if port in ports:
                return weights_dir(out, step), port
    return None


def between_policies(out: Path) -> int | None:
    """The trainer's newest policy when it is done sending it (written as files, or sent in memory)
    and its next one goes in memory (slurm_smoke.toml: every `trainer.ckpt.interval`-th policy and
    the last are files); None otherwise."""
    smoke = tomllib.loads(SLURM_SMOKE.read_text())
    policy = max(published_steps(weights_root(out)), default=0)
    sent = (weights_dir(out, policy) / "model.safetensors").exists() or (
        f"policy {policy} sent in memory" in (out / "logs" / "trainer.log").read_text(errors="replace")
    )
    next_one = policy + 1
    in_memory = next_one % smoke["trainer"]["ckpt"]["interval"] != 0 and next_one < smoke["max_steps"]
    return policy if sent and in_memory else None


@contextmanager
def replica_paused_before_a_memory_policy(box: Box, out: Path, job: tuple[Box, int]) -> Iterator[None]:
    """The replica on host 2 paused while the trainer sends a policy in memory, whose rendezvous
    then waits for it: the trainer is paused between policies first (else let go and caught again),
    the orchestrator samples the batch it needs, the replica is paused, and the trainer goes on."""
    for _ in range(50):
        with ExitStack() as held:
            with paused(box, 0, (TRAINER,)):
                policy = between_policies(out)
                if policy is not None:
                    wait_until(f"batch {policy} published", lambda p=policy: newest_batch(out) >= p, 300, job)
                    held.enter_context(paused(box, 2, INFERENCE_PROCESSES))
            if policy is not None:
                yield  # the trainer trains step `policy` and sends policy + 1 to the paused replica
                return
        time.sleep(0.2)  # the trainer goes on to its next policy
    raise AssertionError("the trainer was never caught between two policies")


def intrude_open_transfer(box: Box, out: Path, job: tuple[Box, int]) -> dict:
    """`intrude` from host 2 on a policy whose rendezvous waits for the (paused) replica: its
    files, and joining or reading its transfer without the secret."""
    wait_until("a policy waiting on host 0", lambda: open_transfer(box, out) is not None, 300, job)
    policy, port = open_transfer(box, out) or (out, 0)
    files = [out, policy, policy / TRANSFER_FILE, policy / SECRET_FILE]
    return intrude(box, 2, "--rendezvous", f"{box.address('envrl-node0')}:{port}", "--files", *map(str, files))


def intrude(box: Box, host: int, *args: str) -> dict:
    """What `nobody` on node `host` gets from the run's listeners and files (intruder.py, `args`)."""
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    argv = ["nsenter", f"--net=/run/netns/{box.netns(box.names[host])}", *user, sys.executable]
    done = subprocess.run(
        [*argv, "-m", "tests.integration.slurm.intruder", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def trained_steps(out: Path) -> list[int]:
    return sorted(m["step"] for m in metric_lines(out) if m.get("process") == "trainer")


LEAD_S = 300
"""The heal job's `--signal=TERM@` lead: longer than `near_time_limit` leaves, so SIGTERM comes at SLURM's next check."""


def test_a_job_heals_processes_killed_on_every_host_stops_at_its_time_limit_and_resumes_through_a_scancel(
    cluster: Box, tmp_path: Path
) -> None:
    out, first, total = tmp_path / "heals", 24, 32
    sbatch = json.dumps(["--time=30", f"--signal=TERM@{LEAD_S}"])
    heal = ["--trainer.weights.transport", "filesystem", "--restarts.max-restarts", "2", "--trainer.ckpt.interval", "4"]
    job = submit(cluster, write_job(out, *heal, "--slurm.sbatch", sbatch, "--max-steps", str(first)))
    wait_until("batch 3 published", lambda: newest_batch(out) >= 3, 600, (cluster, job))
    eval_worker = kill_in_host(cluster, 1, WORKER, signal.SIGKILL, parent=EVAL_ENV)  # the env server's to replace
    for host, needle in ((2, INFERENCE), (1, TRAIN_ENV), (0, ORCHESTRATOR)):
        kill_in_host(cluster, host, needle, signal.SIGKILL)
    healed = [rf"host{host} recovery: {re.escape(name)} was killed by SIGKILL; back after" for host, name in KILLED]
    wait_until("all back", lambda: all(re.search(h, job_log(out, job)) for h in healed), 300, (cluster, job))
    eval_log = out / "logs" / "envs" / "eval" / "learnable.log"
    assert eval_worker not in host_pids(cluster, 1) and eval_log.read_text().count(" starting (pid ") == 2
    wait_until("batch 9 published", lambda: newest_batch(out) >= 9, 300, (cluster, job))

    # The job runs into its --time limit, by SLURM's clock: held at this step meanwhile (its replica
    # paused), so that where the limit lands does not depend on the box's speed; --signal stops it first
    with paused(cluster, 2, INFERENCE_PROCESSES):
        near_time_limit(cluster, job)
        sigterm = lambda: job_log(out, job).count("SIGTERM received: stopping") == cluster.nodes  # noqa: E731
        wait_until("--signal's SIGTERM on every host", sigterm, 120)
    assert wait_job(cluster, job) == "FAILED", job_log(out, job)[-3000:]  # stopped early: not TIMEOUT, not COMPLETED
    assert all(f"host{host} host {host} (" in job_log(out, job) for host in range(cluster.nodes))
    assert job_log(out, job).count("SIGTERM received: stopping") == cluster.nodes, job_log(out, job)[-3000:]
    assert "was stopped by SIGTERM (scancel, or --signal before the time limit)" in job_log(out, job)
    assert not any(run_pids(cluster, host) for host in range(cluster.nodes)), "left running after the job"
    stopped = trained_steps(out)
    assert len(stopped) >= 8 and stopped == list(range(len(stopped)))  # batch 9 was sampled from policy 8
    assert (summary(out)["status"], summary(out)["steps_done"]) == ("interrupted", len(stopped)), summary(out)
    recovered = {name: (entry["host"], entry["restarts"]) for name, entry in summary(out)["recoveries"].items()}
    assert recovered == {name: (host, 1) for host, name in KILLED}, recovered  # every host's, by host

    resumed = submit(cluster, write_job(out, "--resume", "--max-steps", str(total), config=None))  # a larger one
    wait_until("3 more batches", lambda: newest_batch(out) >= len(stopped) + 3, 600, (cluster, resumed))
    subprocess.run(["scancel", str(resumed)], env=environ(cluster), check=True)
    assert wait_job(cluster, resumed) == "CANCELLED"
    wait_until("nothing of the run left", lambda: not any(run_pids(cluster, h) for h in range(cluster.nodes)), 60)
    assert not subprocess.run(["pgrep", "-f", str(out)], capture_output=True).stdout, "a process of the run is left"

    finished = submit(cluster, write_job(out, "--resume", "--max-steps", str(total), config=None))
    assert wait_job(cluster, finished) == "COMPLETED", job_log(out, finished)[-3000:]
    done = summary(out)
    assert (done["status"], done["steps_done"]) == ("success", total), done
    assert trained_steps(out) == list(range(total))  # every step trained once: nothing lost or repeated
    assert [m["step"] for m in metric_lines(out) if "train/reward" in m] == list(range(total))
    check_unique_lines(out)
    assert [run_pids(cluster, host) for host in range(cluster.nodes)] == [[], [], []]


def test_a_job_whose_server_has_no_restart_left_fails_naming_it_and_its_host(cluster: Box, tmp_path: Path) -> None:
    out = tmp_path / "spent"
    job = submit(cluster, write_job(out))  # the smoke config: restarts.max_restarts = 0
    serving = lambda: "eval env server 'learnable' serving at" in job_log(out, job)  # noqa: E731 (both handed over)
    wait_until("host 1's env servers serving", serving, 300, (cluster, job))
    kill_in_host(cluster, 1, TRAIN_ENV, signal.SIGKILL)
    assert wait_job(cluster, job) == "FAILED"
    where = f"host 1 ({cluster.names[1]}, {cluster.address(cluster.names[1])})"
    assert re.search(rf"host1 {re.escape(where)}: .*train env server 'learnable'", job_log(out, job)), job_log(out, job)
    assert f"envrl: {where} exited with code 1: stopping the job" in job_log(out, job)
    done = summary(out)  # written on host 0, which was stopped because host 1 failed
    assert (done["status"], done["reason"], done["failed_process"]) == (
        "failed", f"process failed on {where}", "train env server 'learnable'"
    ), done  # fmt: skip
    wait_until("nothing of the run left", lambda: not any(run_pids(cluster, h) for h in range(cluster.nodes)), 60)
