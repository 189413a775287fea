"""Submitting `rl --slurm` jobs to the box and looking into its hosts while they run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from envrl.data.layout import published_steps, rollouts_root
from scripts.slurm_box.box import environ
from scripts.slurm_box.conf import Box
from tests.support.chaos_runs import ROOT

SLURM_SMOKE = ROOT / "configs" / "debug" / "slurm_smoke.toml"
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")
RUN_PROCESSES = ("envrl.", "VLLM", "vllm", "torchrun")
"""What a process of a run (not SLURM's own) has in its command line or name."""


def write_job(out: Path, *args: str, config: Path | None = SLURM_SMOKE) -> Path:
    """`rl --config config --slurm` for a run in `out` (no `config`: the run's own, to resume it);
    the batch script's path."""
    argv = [sys.executable, "-m", "envrl.launcher.main", *(["--config", str(config)] if config else [])]
    argv += ["--output-dir", str(out), "--no-report", *args, "--slurm"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def submit(box: Box, script: Path) -> int:
    done = subprocess.run(["sbatch", "--parsable", str(script)], env=environ(box), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def newest_batch(out: Path) -> int:
    """The newest batch the orchestrator published (-1: none); older ones may be cleaned up."""
    steps = published_steps(rollouts_root(out))
    return steps[-1] if steps else -1


def job_state(box: Box, job: int) -> str:
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job)], env=environ(box), capture_output=True, text=True
    )
    return shown.stdout.split("JobState=")[1].split()[0] if "JobState=" in shown.stdout else "GONE"


def run_time_s(box: Box, job: int) -> int:
    """How long the running `job` has run, by SLURM's clock."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job)], env=environ(box), capture_output=True, text=True
    )
    days, _, clock = shown.stdout.split("RunTime=")[1].split()[0].rpartition("-")
    hours, minutes, seconds = map(int, clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def near_time_limit(box: Box, job: int) -> None:
    """Move the running `job`'s time limit (whole minutes) to 60-120 s from now: SLURM's own clock then
    runs the job into its limit, and sends its `--signal` when the lead is longer than that."""
    minutes = run_time_s(box, job) // 60 + 2
    update = ["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"]
    subprocess.run(update, env=environ(box), check=True, capture_output=True)


def wait_until(what: str, check: Callable[[], bool], timeout: float, job: tuple[Box, int] | None = None) -> None:
    """Poll `check` until it holds; fail after `timeout` s, or at once when `job` ended first."""
    deadline = time.monotonic() + timeout
    while not check():
        if job is not None and (state := job_state(*job)) in DONE:
            raise AssertionError(f"job {job[1]} ended ({state}) before {what}")
        assert time.monotonic() < deadline, f"not {what} after {timeout:g} s"
        time.sleep(0.5)


def wait_job(box: Box, job: int, timeout: float = 600) -> str:
    """The job's final state."""
    wait_until(f"job {job} done", lambda: job_state(box, job) in DONE, timeout)
    return job_state(box, job)


def host_pids(box: Box, host: int) -> list[int]:
    """Every process in node `host`'s network namespace."""
    listed = subprocess.run(["ip", "netns", "pids", box.netns(box.names[host])], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_pids(box: Box, host: int) -> list[int]:
    """The run's processes on node `host` (not slurmd, slurmstepd or srun)."""
    return [pid for pid in host_pids(box, host) if any(word in command_line(pid) for word in RUN_PROCESSES)]


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def pid_running(box: Box, host: int, needle: str, parent: str | None = None) -> int | None:
    """The oldest process on node `host` whose command line holds `needle` (and its parent's, `parent`)."""
    found = [pid for pid in host_pids(box, host) if needle in command_line(pid)]
    found = [pid for pid in found if parent is None or parent in command_line(parent_pid(pid))]
    return min(found) if found else None


def listeners(box: Box, host: int) -> list[tuple[str, int, str]]:
    """(local address, port, process name) of every TCP listener in node `host`'s namespace."""
    argv = ["nsenter", f"--net=/run/netns/{box.netns(box.names[host])}", "ss", "-ltnpH"]
    lines = subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()
    bound = [(line.split()[3].rsplit(":", 1), line.split('users:(("')[1].split('"')[0]) for line in lines]
    return [(address, int(port), name) for (address, port), name in bound]


def kill_in_host(box: Box, host: int, needle: str, sig: int, parent: str | None = None) -> int:
    pid = pid_running(box, host, needle, parent)
    assert pid is not None, f"no {needle!r} (child of {parent!r}) on {box.names[host]}"
    os.kill(pid, sig)
    return pid
