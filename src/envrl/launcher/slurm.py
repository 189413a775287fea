"""`rl --slurm`: a SLURM batch script whose one `srun` step per host runs that host's slice of the plan under envrl's
supervisor (`launcher/host.py`), every process bound to its node's address; the job ends when the hosts with the
orchestrator and trainers are done or at the first failure (docs/scale.md)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envrl.config import ConfigError, config_to_toml, resolve_config
from envrl.data import host_recoveries, layout
from envrl.envclient.curve import make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.host import FINISHING, STOPPED_EXIT
from envrl.launcher.plan.run import Machine, RunPlan, plan

SIGNAL_MARGIN_S = 10.0
"""Seconds of the job's `--signal` lead left to each host's supervisor once its processes' grace is over."""
SBATCH_LEAD_S = 60
"""sbatch's lead when `--signal` names no `@sig_time`."""
_SIGNAL = re.compile(r"(?:(?P<flags>[RB]{1,2}):)?(?P<signal>\w+)(?:@(?P<lead>\d+))?")


@dataclass(frozen=True)
class JobSignal:
    """The job's `--signal` of `slurm.sbatch`: SIGTERM `lead_s` before the time limit, to every step
    or (`B:`, `batch_only`) to the batch shell alone, which forwards it to every step."""

    option: str
    lead_s: int
    batch_only: bool


def job_signal(sbatch: Sequence[str]) -> JobSignal | None:
    """The last `--signal` of `sbatch` (as sbatch reads it: `[{R|B}:]<sig>[@<lead>]`), or None;
    ConfigError for a signal other than SIGTERM, which is what stops a host's supervisor."""
    given = [option for option in sbatch if option.startswith(("--signal=", "--signal "))]
    if not given:
        return None
    option = given[-1]
    match = _SIGNAL.fullmatch(option.removeprefix("--signal").lstrip("= "))
    if match is None or _signal_number(match["signal"]) != signal.SIGTERM:
        raise ConfigError(
            f"slurm.sbatch: {option!r} sends no SIGTERM, which is what stops each host's supervisor "
            "(launcher/host.py): give --signal=TERM@<seconds> (or B:TERM@<seconds>), or leave --signal out"
        )
    return JobSignal(option, int(match["lead"] or SBATCH_LEAD_S), "B" in (match["flags"] or ""))


def _signal_number(name: str) -> int | None:
    """The number of a signal named as sbatch takes it (`15`, `TERM`, `SIGTERM`), or None."""
    if name.isdigit():
        return int(name)
    spelled = name.upper()
    return getattr(signal.Signals, spelled if spelled.startswith("SIG") else f"SIG{spelled}", None)


def host_grace_s(job: JobSignal | None) -> float:
    """Seconds each host's supervisor gives its processes from SIGTERM to SIGKILL: the job's
    `--signal` lead less `SIGNAL_MARGIN_S`, never under `RLConfig.shutdown_grace_s` (that alone
    without `--signal`), so a trainer's checkpoint on SIGTERM gets the time the job leaves it."""
    if job is None:
        return RLConfig.shutdown_grace_s
    return max(RLConfig.shutdown_grace_s, job.lead_s - SIGNAL_MARGIN_S)


def job_hosts(rl: RLConfig) -> list[str]:
    """The job's hosts as the batch script names them: `${ADDR_0}` .. (each node's address, which
    SLURM knows once the job runs; a node's name need not resolve on the other nodes)."""
    return [f"${{ADDR_{i}}}" for i in range(rl.slurm.nodes)]


def write_job_files(run: RunPlan) -> None:
    """Each process's config, the CURVE keys and the log directories of the planned job."""
    for name, config in run.configs().items():
        path = layout.process_config_file(run.output_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_toml(config))
    for _, command in run.start_order():
        command.log_file.parent.mkdir(parents=True, exist_ok=True)
    make_curve_keys(run.curve_dir)
    host_recoveries.clear(run.output_dir)  # an earlier job's restarts are not this job's


def _secret_line(name: str, make: str, what: str) -> str:
    """Export `name`, generated unless the job's environment has it: a value never on a command line."""
    return f'export {name}="${{{name}:-{make}}}"  # {what}'


def host_step(python: str, stored: Path, host: int, hosts: str, grace_s: float) -> str:
    """The srun step running host `host`'s slice of the run under its supervisor (`launcher/host.py`),
    which gives each process `grace_s` from SIGTERM to SIGKILL."""
    step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=0", f'--nodelist="${{HOST_{host}}}"']
    slice_ = [python, "-m", "envrl.launcher.host", "--config", shlex.quote(str(stored)), "--hosts", f'"{hosts}"']
    return " ".join([*step, *slice_, "--grace-s", f"{grace_s:g}", "--host", str(host), "&"])


def _grace_lines(job: JobSignal | None, grace_s: float) -> list[str]:
    """The script's word on how its host steps stop: the grace and where it comes from; with `B:`,
    the trap that forwards the batch shell's SIGTERM to every step."""
    if job is None:
        return [
            f"# no --signal in slurm.sbatch: each host's supervisor gives its processes {grace_s:g} s from SIGTERM to SIGKILL"
        ]
    lines = [
        f"# {job.option}: SIGTERM {job.lead_s} s before the time limit; each host's supervisor gives its processes",
        f"# {grace_s:g} s from SIGTERM to SIGKILL (--grace-s: the lead less {SIGNAL_MARGIN_S:g} s for its own exit, at least {RLConfig.shutdown_grace_s:g} s)",
    ]
    if job.batch_only:
        lines += [
            "# B: signals this batch shell only: it forwards SIGTERM to every host step",
            'trap \'echo "envrl: SIGTERM (--signal): forwarded to every host step" >&2; '
            'scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null\' TERM',
        ]
    return lines


def _end_lines(out: Path, grace_s: float, forwards: bool) -> list[str]:
    """The script's end: wait for the hosts that finish the run, or stop the job at the first host
    that fails or is stopped (saying how to continue a stopped run), then stop every host step."""
    resume = (
        " (scancel, or --signal before the time limit): stopping the job; it continues with "
        f"`rl --resume --slurm --output-dir {out.resolve()}` (any --max-steps)"
    )
    return [
        "# the run ends when every host with the trainer or the orchestrator is done, or at the first failure",
        "status=0",
        "while [ ${#FINISHING[@]} -gt 0 ]; do",
        "  code=0; wait -n -p pid || code=$?",
        *(
            ['  [ -z "${pid:-}" ] && continue  # the trap woke the wait: the hosts stop on what it forwarded']
            if forwards
            else []
        ),
        f"  if [ $code -eq {STOPPED_EXIT} ]; then",
        f'    echo "envrl: ${{NAME[$pid]}} was stopped by SIGTERM"{shlex.quote(resume)} >&2; status=1; break',
        '  elif [ $code -ne 0 ] || [[ " ${FINISHING[*]} " != *" $pid "* ]]; then',
        '    echo "envrl: ${NAME[$pid]} exited with code $code: stopping the job" >&2; status=1; break',
        "  fi",
        '  FINISHING=("${FINISHING[@]/$pid}"); FINISHING=(${FINISHING[@]})',
        "done",
        f"# SIGTERM to every host's step: its supervisor stops what it started within {grace_s:g} s (--grace-s)",
        'scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null',
        'for pid in "${!NAME[@]}"; do [[ ${NAME[$pid]} == log-rotation ]] && kill "$pid"; done',
        "until wait; do :; done  # a trapped SIGTERM wakes `wait`: the steps still get their grace"
        if forwards
        else "wait",
        "exit $status",
        "",
    ]


def sbatch_script(rl: RLConfig, stored: Path, machine: Machine | None = None) -> str:
    """The batch script of the run whose `RLConfig` is stored (TOML) at `stored`."""
    slurm, out = rl.slurm, rl.output_dir
    signalled = job_signal(slurm.sbatch)
    grace_s = host_grace_s(signalled)
    forwards = signalled is not None and signalled.batch_only  # the batch shell traps SIGTERM (`_grace_lines`)
    job = plan(rl, job_hosts(rl), machine)  # the script's commands; its first step plans the configs again
    python = shlex.quote(sys.executable)
    make_token = f'$({python} -c "import secrets; print(secrets.token_urlsafe(32))")'
    addresses = ",".join(job_hosts(rl))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=envrl-{out.name}",
        f"#SBATCH --nodes={slurm.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node else []),
        f"#SBATCH --output={layout.logs_dir(out).resolve()}/slurm-%j.out",
        *[f"#SBATCH {option}" for option in slurm.sbatch],
        "# Written by `rl --slurm` (envrl.launcher.slurm) from the run's resolved config; submit with sbatch.",
        "# One srun step per host runs its slice of the run under envrl's supervisor (envrl.launcher.host);",
        "# each process logs in the run's logs/. The run directory must be on a filesystem every host",
        "# mounts at the same path (docs/scale.md).",
        "set -uo pipefail",
        *_grace_lines(signalled, grace_s),
        f"cd {shlex.quote(os.getcwd())}",
        'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "# each node's address as SLURM knows it (NodeAddr): what the run's processes bind and dial",
        "ADDRS=()",
        'for host in "${HOSTS[@]}"; do',
        '  ADDRS+=("$(scontrol show node "$host" -o | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')")',
        "done",
        *[f"HOST_{i}=${{HOSTS[{i}]}} ADDR_{i}=${{ADDRS[{i}]}}" for i in range(slurm.nodes)],
        *[_secret_line(secret.name, make_token, secret.what) for secret in job.secrets],
        "# each process's config for these hosts (and the env servers' CURVE keys)",
        f'{python} -m envrl.launcher.slurm --config {shlex.quote(str(stored))} --hosts "{addresses}" || exit 2',
        "declare -A NAME",
        "FINISHING=()",
    ]
    rotation = rl.log_rotation
    rotate = f"--logs-dir {shlex.quote(str(layout.logs_dir(out)))} --max-mb {rotation.max_mb:g} --keep {rotation.keep}"
    lines += [
        "# every host's logs are in the run directory: rotated from here (envrl.launcher.log_rotation)",
        f"{python} -m envrl.launcher.log_rotation {rotate} &",
        "NAME[$!]=log-rotation",
    ]
    for i in range(len(job.hosts)):
        names = [c.name for c in job.on_host(i)]
        lines.append(f"# host {i}: {', '.join(names)}")
        lines.append(host_step(python, stored, i, addresses, grace_s))
        lines.append(f'NAME[$!]="host {i} (${{HOST_{i}}}, ${{ADDR_{i}}})"')
        if any(name.startswith(FINISHING) for name in names):
            lines.append("FINISHING+=($!)")
    lines += _end_lines(out, grace_s, forwards)
    return "\n".join(lines)


def write_sbatch(rl: RLConfig, machine: Machine | None = None) -> Path:
    """Store the run's config and its batch script under `<output_dir>/slurm/`; the script's path."""
    layout.slurm_dir(rl.output_dir).mkdir(parents=True, exist_ok=True)
    layout.logs_dir(rl.output_dir).mkdir(parents=True, exist_ok=True)  # SLURM opens the job's log there
    stored = layout.slurm_config_file(rl.output_dir)
    kept = rl.model_copy()
    kept.__pydantic_fields_set__ = rl.model_fields_set - {"clean"}
    stored.write_text(config_to_toml(kept, only_set=True))
    script = layout.slurm_script_file(rl.output_dir)
    script.write_text(sbatch_script(rl, stored.resolve(), machine))
    return script


def main(argv: Sequence[str] | None = None) -> None:
    """The batch script's first step: write each process's config for the job's hosts."""
    parser = argparse.ArgumentParser(prog="python -m envrl.launcher.slurm", description=main.__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run's stored config (slurm/rl.toml)")
    parser.add_argument("--hosts", required=True, help="the job's hosts, comma-separated, in node order")
    args = parser.parse_args(argv)
    try:
        job = plan(resolve_config(RLConfig, [args.config]), args.hosts.split(","), Machine.here())
    except ConfigError as e:
        print(f"{parser.prog}: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    write_job_files(job)
    for i, host in enumerate(job.hosts):
        print(f"host {i} ({host}): {', '.join(command.name for command in job.on_host(i))}")


if __name__ == "__main__":
    main()
