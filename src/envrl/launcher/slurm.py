"""`rl --slurm`: a SLURM batch script running exactly the plan's commands for the job's hosts, one `srun` step per
process; the job ends when orchestrator and trainers are done or at the first failure (docs/scale.md)."""

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
from envrl.launcher.plan.commands import Command
from envrl.launcher.plan.run import Machine, RunPlan, plan
from envrl.runtime.process import ALLOWED_ENV, ALLOWED_ENV_PREFIXES

FINISHING = ("trainer", "orchestrator")
"""Commands whose exit ends the run (by name prefix); the others serve until the job stops them."""


def job_hosts(rl: RLConfig) -> list[str]:
    """The job's hosts as the batch script names them: `${HOST_0}` .. (SLURM names them when it runs)."""
    return [f"${{HOST_{i}}}" for i in range(rl.slurm.nodes)]


def write_job_files(run: RunPlan) -> None:
    """Each process's config, the CURVE keys and the log directories of the planned job."""
    for name, config in run.configs().items():
        path = layout.process_config_file(run.output_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_toml(config))
    for _, command in run.start_order():
        command.log_file.parent.mkdir(parents=True, exist_ok=True)
    make_curve_keys(run.curve_dir)


def _word(token: str) -> str:
    """A shell word: a host variable expands (`"${HOST_0}:29500"`), everything else is quoted."""
    return f'"{token}"' if "${HOST_" in token else shlex.quote(token)


PREFIXED_ENV = "ENVRL_PREFIXED_ENV"
"""The script's `,NAME,...` string of every variable of the job under `ALLOWED_ENV_PREFIXES`."""


def prefixed_env_lines() -> list[str]:
    """Script lines collecting the names of the job's variables under `ALLOWED_ENV_PREFIXES` (e.g.
    `LC_*`), which the allow-list passes by prefix, so their names are only known when the job runs."""
    patterns = "|".join(f"{prefix}*" for prefix in ALLOWED_ENV_PREFIXES)
    return [
        f"{PREFIXED_ENV}=  # the allow-list's variables by prefix (envrl.runtime.process.ALLOWED_ENV_PREFIXES)",
        f"for name in $(compgen -e); do case $name in {patterns}) {PREFIXED_ENV}+=,$name;; esac; done",
    ]


def export_option(passed: list[str]) -> str:
    """srun's `--export` giving a step only the allow-list of `runtime.process.allowed_environ` plus
    `passed`, with the values they have in the job (a variable not set stays unset). Names only:
    srun reads the values from its own environment, so no value is a word of any command line
    (another user reads those in /proc/<pid>/cmdline)."""
    names = ",".join(sorted(ALLOWED_ENV | set(passed)))
    return f'--export="{names}${{{PREFIXED_ENV}}}"'


def srun_line(command: Command, host: int) -> str:
    """One srun step starting `command` on host `host`, in the background, its output to its log.
    A command with an allow-list (an env server) sees only that of the job's environment."""
    step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f'--nodelist="${{HOST_{host}}}"']
    step.append(f"--output={shlex.quote(str(command.log_file))}")
    if command.allowed_env is not None:
        step.append(export_option(command.allowed_env))
    env = [f"{key}={shlex.quote(value)}" for key, value in command.env.items()]
    return " ".join([*step, *(["env", *env] if env else []), *map(_word, command.argv), "&"])


def _secret_line(name: str, make: str, what: str) -> str:
    """Export `name`, generated unless the job's environment has it: a value never on a command line."""
    return f'export {name}="${{{name}:-{make}}}"  # {what}'


def sbatch_script(rl: RLConfig, stored: Path, machine: Machine | None = None) -> str:
    """The batch script of the run whose `RLConfig` is stored (TOML) at `stored`."""
    slurm, out = rl.slurm, rl.output_dir
    job = plan(rl, job_hosts(rl), machine)  # the script's commands; its first step plans the configs again
    python = shlex.quote(sys.executable)
    make_token = f'$({python} -c "import secrets; print(secrets.token_urlsafe(32))")'
    host_list = ",".join(f"${{HOST_{i}}}" for i in range(slurm.nodes))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=envrl-{out.name}",
        f"#SBATCH --nodes={slurm.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node else []),
        f"#SBATCH --output={layout.logs_dir(out).resolve()}/slurm-%j.out",
        *[f"#SBATCH {option}" for option in slurm.sbatch],
        "# Written by `rl --slurm` (envrl.launcher.slurm) from the run's resolved config; submit with sbatch.",
        "# One srun step per process on its host; logs in the run's logs/. The run directory must be on a",
        "# filesystem every host mounts at the same path (docs/scale.md).",
        "set -uo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        *[f"HOST_{i}=${{HOSTS[{i}]}}" for i in range(slurm.nodes)],
        *[_secret_line(secret.name, make_token, secret.what) for secret in job.secrets],
        *prefixed_env_lines(),
        "# each process's config for these hosts (and the env servers' CURVE keys)",
        f'{python} -m envrl.launcher.slurm --config {shlex.quote(str(stored))} --hosts "{host_list}" || exit 2',
        "declare -A NAME",
        "FINISHING=()",
    ]
    lines += [f"# host {i}: {', '.join(c.name for c in job.on_host(i))}" for i in range(len(job.hosts))]
    rotation = rl.log_rotation
    rotate = f"--logs-dir {shlex.quote(str(layout.logs_dir(out)))} --max-mb {rotation.max_mb:g} --keep {rotation.keep}"
    lines += [
        "# every host's logs are in the run directory: rotated from here (envrl.launcher.log_rotation)",
        f"{python} -m envrl.launcher.log_rotation {rotate} &",
        "NAME[$!]=log-rotation",
    ]
    for i, command in job.start_order():
        lines.append(srun_line(command, i))
        lines.append(f"NAME[$!]={shlex.quote(command.name)}")
        if command.name.startswith(FINISHING):
            lines.append("FINISHING+=($!)")
    lines += [
        "# the run ends when the orchestrator and every trainer host are done, or at the first failure",
        "status=0",
        "while [ ${#FINISHING[@]} -gt 0 ]; do",
        "  code=0; wait -n -p pid || code=$?",
        '  if [ $code -ne 0 ] || [[ " ${FINISHING[*]} " != *" $pid "* ]]; then',
        '    echo "envrl: ${NAME[$pid]} exited with code $code: stopping the job" >&2; status=1; break',
        "  fi",
        '  FINISHING=("${FINISHING[@]/$pid}"); FINISHING=(${FINISHING[@]})',
        "done",
        "kill $(jobs -p) 2>/dev/null; wait",
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
