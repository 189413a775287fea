"""One host's slice of a run's plan, started and supervised as `rl` does on one box: each process
restarts as its policy says, and the step stops everything it started before it exits, naming a
failed process and its host (docs/scale.md)."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: as an srun step under `spawn`'s watch, a parent that dies mid-import leaves no orphan

import argparse
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from envrl.config import ConfigError, resolve_config
from envrl.data import host_recoveries, layout
from envrl.launcher import recovery, summary
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.commands import Command
from envrl.launcher.plan.cpus import pin
from envrl.launcher.plan.run import TEACHER, Machine, RunPlan, plan
from envrl.launcher.replicas import wait_for_replicas
from envrl.launcher.run_keys import make_secrets
from envrl.runtime.process import Child, ChildFailed, spawn
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Respawn, Supervisor
from envrl.serve.launch import begin as begin_env_server
from envrl.serve.launch import ready as env_server_ready
from envrl.serve.launch import start as start_env_server
from envrl.telemetry.log import setup_logging

FINISHING = ("trainer", "orchestrator")
"""Processes whose exit 0 ends their host's slice (by name prefix); the others serve until stopped."""


def start(
    run: RunPlan, supervisor: Supervisor, restarts: RestartPolicy, secrets: dict[str, str], host: int | None = None
) -> None:
    """Start every process of `run` on `host` (None: every host) with the run's `secrets`, each
    with its way back when it dies (`launcher/recovery.py`)."""
    plan, cpus = run.commands, run.cpus

    def here(command: Command | None) -> bool:
        return command is not None and (host is None or run.host_of[command.name] == host)

    if cpus is not None:
        logger.info(f"cores: inference computes on {cpus.inference}, the trainer on {cpus.trainer}")
    replicas = [command for command in plan.inference if here(command)]
    if replicas:
        what = "inference server" if len(replicas) == 1 else f"{len(replicas)} inference replicas"
        logger.info(f"starting {what} (vLLM; about a minute on CPU)")
    deadline = time.monotonic() + run.inference.ready_timeout_s  # before the orchestrator's own
    out, configs = run.output_dir, run.replicas
    # vLLM's in-process worker (and all it starts) inherits the affinity, as torchrun's ranks do the trainer's
    spawn = partial(_spawn, secrets=secrets)
    spawn_inference = partial(spawn, cores=cpus.inference if cpus else None)
    spawn_trainer = partial(spawn, cores=cpus.trainer if cpus else None)
    token = secrets[run.inference.reload.token_env]
    inference = {}
    for command in replicas:
        url, model = configs[command.name].base_url, run.orchestrator.model.name
        respawn = recovery.replica_respawn(command, spawn_inference, restarts, url, model, out, token)
        inference[command.name] = supervisor.add(spawn_inference(command), respawn)
    # a teacher on the replicas' devices starts once they serve: vLLM sizes its memory from what is free
    teacher_later = run.placement.teacher_shares_inference
    if not teacher_later and here(plan.teacher):
        _start_teacher(run, supervisor, restarts, spawn_inference, inference)
    for trainer in filter(here, [plan.trainer, *plan.trainer_nodes]):
        respawn = recovery.trainer_respawn(trainer, spawn_trainer, restarts, out)
        supervisor.add(spawn_trainer(trainer), respawn)  # it imports and loads while the env servers do
    _start_env_servers(run, supervisor, secrets, here)
    if here(plan.orchestrator):
        orchestrator = recovery.orchestrator_respawn(plan.orchestrator, spawn, restarts, out)
        supervisor.add(spawn(plan.orchestrator), orchestrator)
        logger.info(f"trainer and orchestrator started; logs in {plan.orchestrator.log_file.parent}")
    # Trainer and orchestrator import and load while vLLM starts; the orchestrator waits for it.
    if teacher_later and here(plan.teacher):
        wait_for_replicas(inference, configs, supervisor, deadline)
        deadline = time.monotonic() + run.inference.ready_timeout_s  # the teacher's own start-up
        _start_teacher(run, supervisor, restarts, spawn_inference, inference)
    if run.teacher is not None:
        configs = {**configs, TEACHER: run.teacher}
    wait_for_replicas(inference, configs, supervisor, deadline)


def _start_teacher(
    run: RunPlan,
    supervisor: Supervisor,
    restarts: RestartPolicy,
    spawn_inference: Callable[[Command], Child],
    inference: dict[str, Child],
) -> None:
    """Start the distillation teacher's server, if the run has one, supervised like a replica on fixed weights."""
    teacher = run.commands.teacher
    if teacher is None or run.teacher is None:
        return
    logger.info(f"starting the distillation teacher's server on {run.teacher.model.name} (vLLM)")
    respawn = recovery.teacher_respawn(teacher, spawn_inference, restarts, run.teacher.base_url)
    inference[teacher.name] = supervisor.add(spawn_inference(teacher), respawn)


def _start_env_servers(
    run: RunPlan, supervisor: Supervisor, secrets: dict[str, str], here: Callable[[Command], bool]
) -> None:
    """Begin every env server on this host at once, so they load their envs side by side, then wait
    for each in turn and hand it to the supervisor; a failure to begin or start one stops every
    server not yet handed over."""
    begun = []
    handed = 0
    try:
        for server, command in zip(run.env_servers, run.commands.env_servers, strict=True):
            if not here(command):
                continue
            how = dict(argv=command.argv, log_file=command.log_file, environ=command.environ(secrets))
            begun.append((server, command, partial(start_env_server, server, **how), begin_env_server(server, **how)))
        for server, command, start_server, starting in begun:
            child, _ = env_server_ready(server, starting, command.log_file)
            supervisor.add(child, Respawn(partial(_server_child, start_server), server.restarts))
            handed += 1
    except BaseException:
        for *_, pending in begun[handed:]:
            pending.abandon()
        raise


def _server_child(start_server: Callable[[], tuple[Child, str]]) -> Child:
    """An env server started (again) on the fixed address its config names, so clients reconnect to it."""
    return start_server()[0]


def _spawn(command: Command, cores: list[int] | None = None, secrets: dict[str, str] | None = None) -> Child:
    child = spawn(command.argv, name=command.name, log_file=command.log_file, env=command.environ(secrets or {}))
    if cores is not None:
        pin(child.popen.pid, cores)
    return child


STOPPED_EXIT = 128 + signal.SIGTERM


class Stopped(Exception):
    """SLURM stops the step (scancel, the job's end, `--signal`)."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def run_slice(rl: RLConfig, hosts: Sequence[str], host: int, grace_s: float) -> int:
    """Run host `host`'s slice of the job until its finishing processes are done (or, with none,
    until SIGTERM), each process given `grace_s` from SIGTERM to SIGKILL when stopped; 0 when done,
    1 when a process failed past its budget, `STOPPED_EXIT` when stopped (scancel, `--signal`
    before the time limit: the job is not complete)."""
    run = plan(rl, hosts, Machine.here())
    where = f"host {host} ({socket.gethostname()}, {hosts[host]})"
    log_file = layout.process_log_file(rl.output_dir, f"host{host}")
    setup_logging(rl.log.model_copy(update={"file": log_file}), process=f"host{host}")
    mine = [command.name for command in run.on_host(host)]
    logger.info(f"{where}: {', '.join(mine)}")
    signal.signal(signal.SIGTERM, _stop)
    writes_summary = "orchestrator" in mine  # the run's outcome, as rl writes it, from the host that drives the steps
    publish = None if writes_summary else partial(_publish_recoveries, rl.output_dir, host)  # for that host
    supervisor = Supervisor(grace=grace_s, on_recovery=publish)
    until = {name for name in mine if name.startswith(FINISHING)}
    started, code = time.monotonic(), 0
    outcome = summary.Outcome(status="success", reason="completed")
    try:
        start(run, supervisor, rl.restarts, make_secrets(run.secrets), host)
        supervisor.watch(until=until, stop=None if until else threading.Event())  # no finishing process: until SIGTERM
        logger.info(f"{where}: done")
    except Stopped as e:
        logger.info(f"{where}: {e} received: stopping {', '.join(mine)}")
        code, outcome = STOPPED_EXIT, _stopped_outcome(rl.output_dir, str(e))
    except ChildFailed as e:
        logger.error(f"{where}: {e}")
        failed = summary.Outcome(status="failed", reason=f"process failed on {where}", error=str(e))
        code, outcome = 1, summary.naming_the_dead(failed, supervisor.children)
        if publish is not None:  # before this step exits, and so before the job stops the host with the summary
            publish(supervisor.recoveries(), outcome)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if writes_summary:
            recoveries = host_recoveries.gather(rl.output_dir, host, supervisor.recoveries())
            summary.write(rl.output_dir, sys.argv[1:], outcome, time.monotonic() - started, recoveries)
        supervisor.stop_all()
    return code


def _stopped_outcome(output_dir: Path, signal_name: str) -> summary.Outcome:
    """The job's outcome when this host is stopped: failed, when another host's failure is why
    (it publishes that before its step exits and the job stops the others), else interrupted."""
    failed = host_recoveries.failure(output_dir)
    return failed or summary.Outcome(status="interrupted", reason=signal_name)


def _publish_recoveries(
    output_dir: Path,
    host: int,
    recoveries: dict[str, dict[str, Any]],
    failure: summary.Outcome | None = None,
) -> None:
    """Write host `host`'s `recoveries` (and the `failure` that ends its slice) for the host that
    writes `summary.json`; a failed write is logged, never the end of the host's processes."""
    try:
        host_recoveries.write(output_dir, host, recoveries, failure)
    except OSError as e:
        logger.warning(f"host {host}: {e}; summary.json will miss its restarts (this log has each one)")


def main(argv: Sequence[str] | None = None) -> None:
    """One srun step of an `rl --slurm` job: this host's slice of the run, supervised."""
    parser = argparse.ArgumentParser(prog="python -m envrl.launcher.host", description=main.__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run's stored config (slurm/rl.toml)")
    parser.add_argument("--hosts", required=True, help="the job's host addresses, comma-separated, in node order")
    parser.add_argument("--host", type=int, required=True, help="this host's index in --hosts")
    grace = "seconds each process gets from SIGTERM to SIGKILL (rl --slurm: from the job's --signal)"
    parser.add_argument("--grace-s", type=float, default=RLConfig.shutdown_grace_s, help=grace)
    args = parser.parse_args(argv)
    try:
        rl = resolve_config(RLConfig, [args.config])
    except ConfigError as e:
        print(f"{parser.prog}: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(run_slice(rl, args.hosts.split(","), args.host, args.grace_s))


if __name__ == "__main__":
    main()
