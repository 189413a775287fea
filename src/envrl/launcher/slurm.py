"""`rl --slurm`: a SLURM batch script whose one `srun` step per host runs that host's slice of the plan under envrl's
supervisor (`launcher/host.py`), every process bound to its node's address; the job ends when the hosts with the
orchestrator and trainers are done or at the first failure (docs/scale.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from envrl.config import ConfigError, config_to_toml, resolve_config
from envrl.data import layout
from envrl.envclient.curve import make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.host import FINISHING
from envrl.launcher.plan.run import Machine, RunPlan, plan


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


def _secret_line(name: str, make: str, what: str) -> str:
    """Export `name`, generated unless the job's environment has it: a value never on a command line."""
    return f'export {name}="${{{name}:-{make}}}"  # {what}'


def host_step(python: str, stored: Path, host: int, hosts: str) -> str:
    """The srun step running host `host`'s slice of the run under its supervisor (`launcher/host.py`)."""
    step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=0", f'--nodelist="${{HOST_{host}}}"']
    slice_ = [python, "-m", "envrl.launcher.host", "--config", shlex.quote(str(stored)), "--hosts", f'"{hosts}"']
    return " ".join([*step, *slice_, "--host", str(host), "&"])


def sbatch_script(rl: RLConfig, stored: Path, machine: Machine | None = None) -> str:
    """The batch script of the run whose `RLConfig` is stored (TOML) at `stored`."""
    slurm, out = rl.slurm, rl.output_dir
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
        lines.append(host_step(python, stored, i, addresses))
        lines.append(f'NAME[$!]="host {i} (${{HOST_{i}}}, ${{ADDR_{i}}})"')
        if any(name.startswith(FINISHING) for name in names):
            lines.append("FINISHING+=($!)")
    lines += [
        "# the run ends when every host with the trainer or the orchestrator is done, or at the first failure",
        "status=0",
        "while [ ${#FINISHING[@]} -gt 0 ]; do",
        "  code=0; wait -n -p pid || code=$?",
        '  if [ $code -ne 0 ] || [[ " ${FINISHING[*]} " != *" $pid "* ]]; then',
        '    echo "envrl: ${NAME[$pid]} exited with code $code: stopping the job" >&2; status=1; break',
        "  fi",
        '  FINISHING=("${FINISHING[@]/$pid}"); FINISHING=(${FINISHING[@]})',
        "done",
        "# SIGTERM to every host's step: its supervisor stops what it started within shutdown_grace_s",
        'scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null',
        'for pid in "${!NAME[@]}"; do [[ ${NAME[$pid]} == log-rotation ]] && kill "$pid"; done',
        "wait",
        "exit $status",
        "",
    ]
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
