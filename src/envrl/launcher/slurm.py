"""`rl --config x.toml --slurm`: the run as a SLURM batch script, each host running its slice.

Guarantee: `plan_job(rl, hosts)` places every process that `rl` starts on one host onto the
job's hosts, as `[slurm]` says: trainer ranks on the first `trainer_nodes` hosts (torchrun, its
rendezvous on host 0), `inference.replicas` servers on each of the last `inference_nodes`, the env
servers on `env_node` (over CURVE, as under `rl`), the orchestrator on host 0. Each
process's config is the one `resolve_run` makes for `rl`, with only its addresses changed to the
hosts'. The script `sbatch_script` writes runs exactly the commands of `plan_job` for the job's
hosts: its first step writes their configs once SLURM has named the hosts (`python -m
envrl.launcher.slurm`, which calls `plan_job` again), then one `srun` step per process starts it
on its host (an env server with only the allow-list of the job's environment that `rl` gives it,
never the reload token); the job ends when the orchestrator and every trainer host are done, or at
the first failure, and SLURM stops what is left. envrl writes commands; SLURM places and stops
processes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from envrl.config import config_to_toml, resolve_config
from envrl.data import layout
from envrl.launcher.commands import Command, env_server_key, inference_command, launch_plan, trainer_argv
from envrl.launcher.config import RLConfig, resolve_run
from envrl.launcher.placement import place
from envrl.launcher.replicas import replica_configs, replica_name
from envrl.launcher.run_keys import make_curve_keys
from envrl.runtime.net import is_loopback_host
from envrl.runtime.process import ALLOWED_ENV, ALLOWED_ENV_PREFIXES
from envrl.runtime.secrets import API_KEY_ENV

FINISHING = ("trainer", "orchestrator")
"""Commands whose exit ends the run (by name prefix); the others serve until the job stops them."""


@dataclass(frozen=True)
class HostSlice:
    host: str
    commands: list[Command]
    """In start order: inference replicas, env servers, trainer ranks, orchestrator."""


@dataclass(frozen=True)
class JobPlan:
    hosts: list[HostSlice]
    """One per host of the job, in the job's node order."""
    configs: dict[str, BaseModel]
    """Each process's config by name (`configs/<name>.toml` in the run directory)."""
    output_dir: Path
    start_order: list[tuple[int, Command]]
    """(host index, command) of every process in start order: servers, then trainer and orchestrator."""
    curve_dir: Path
    """Where the job makes the env servers' and the orchestrator's CURVE keys."""


def plan_job(rl: RLConfig, hosts: Sequence[str]) -> JobPlan:
    """Every process of the run on its host (module docstring); `hosts` in the job's node order."""
    slurm = rl.slurm
    if len(hosts) != slurm.nodes:
        raise ValueError(f"{len(hosts)} hosts given for a job of slurm.nodes = {slurm.nodes}")
    run = resolve_run(rl)
    placement = place(rl.trainer, rl.inference, None, rl.inference.replicas)
    base = launch_plan(run, placement, None)
    out, head, env_host = run.trainer.output_dir, hosts[0], hosts[slurm.env_node]
    order: list[tuple[int, Command]] = []

    def start(host: int, command: Command) -> None:
        order.append((host % len(hosts), command))

    configs: dict[str, BaseModel] = {}

    total = slurm.inference_nodes * rl.inference.replicas
    urls = []
    for n in range(slurm.inference_nodes):
        host = slurm.nodes - slurm.inference_nodes + n
        node = run.inference.model_copy(update={"host": hosts[host]}, deep=True)
        node.reload.allow_remote = node.reload.allow_remote or not is_loopback_host(hosts[host])
        for i, config in enumerate(replica_configs(node).values()):
            name = replica_name(n * rl.inference.replicas + i, total)
            configs[name] = config
            urls.append(config.base_url)
            start(host, inference_command(name, out, placement.inference_env(i), {}))

    moved = {}  # the env servers keep the run's CURVE keys (`resolve_run`), on any host
    for server, command in zip(run.env_servers, base.env_servers, strict=True):
        address = f"tcp://{env_host}:{urlsplit(server.config.address).port}"
        moved[server.config.address] = address
        access = server.config.model_access.model_copy(update={"base_urls": urls})
        update = {"address": address, "model_access": access}
        configs[env_server_key(server.split, server.name)] = server.config.model_copy(update=update)
        start(slurm.env_node, command)
    evals = run.orchestrator.eval.addresses
    for env in run.orchestrator.envs:
        env.address = moved.get(env.address, env.address)  # type: ignore[arg-type]
    run.orchestrator.eval.addresses = {name: moved.get(address, address) for name, address in evals.items()}

    run.trainer.weights.host = head  # the memory transport: replicas reach trainer rank 0 there
    configs["trainer"] = run.trainer
    for rank in range(slurm.trainer_nodes):
        argv = trainer_argv(
            sys.executable, placement.trainer_ranks, layout.process_config_file(out, "trainer"), slurm.trainer_nodes, rank, head,
            slurm.rendezvous_port,
        )  # fmt: skip
        name = "trainer" if rank == 0 else f"trainer-node{rank}"
        log = layout.process_log_file(out, name)
        start(rank, base.trainer.model_copy(update={"name": name, "argv": argv, "log_file": log}))

    run.orchestrator.inference.base_url = urls if len(urls) > 1 else urls[0]
    configs["orchestrator"] = run.orchestrator
    start(0, base.orchestrator.model_copy(update={"secret_env": {}}))
    slices = [HostSlice(host, [command for i, command in order if i == index]) for index, host in enumerate(hosts)]
    return JobPlan(slices, configs, out, order, layout.curve_dir(out))


def write_job_files(plan: JobPlan) -> None:
    """Each process's config, the CURVE keys and the log directories of `plan`."""
    for name, config in plan.configs.items():
        path = layout.process_config_file(plan.output_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_toml(config))
    for host in plan.hosts:
        for command in host.commands:
            command.log_file.parent.mkdir(parents=True, exist_ok=True)
    make_curve_keys(plan.curve_dir)


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


def sbatch_script(rl: RLConfig, stored: Path) -> str:
    """The batch script of the run whose `RLConfig` is stored (TOML) at `stored`."""
    slurm, out = rl.slurm, rl.output_dir
    plan = plan_job(rl, [f"${{HOST_{i}}}" for i in range(slurm.nodes)])
    token_env, python = rl.inference.reload.token_env, shlex.quote(sys.executable)
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
        _secret_line(token_env, make_token, "/update_weights token: never to env servers"),
        _secret_line(API_KEY_ENV, make_token, "vLLM's API key: the run's every client sends it"),
        *prefixed_env_lines(),
        "# each process's config for these hosts (and the env servers' CURVE keys)",
        f'{python} -m envrl.launcher.slurm --config {shlex.quote(str(stored))} --hosts "{host_list}" || exit 2',
        "declare -A NAME",
        "FINISHING=()",
    ]
    lines += [
        f"# host {i}: {', '.join(command.name for command in host.commands)}" for i, host in enumerate(plan.hosts)
    ]
    rotation = rl.log_rotation
    rotate = f"--logs-dir {shlex.quote(str(layout.logs_dir(out)))} --max-mb {rotation.max_mb:g} --keep {rotation.keep}"
    lines += [
        "# every host's logs are in the run directory: rotated from here (envrl.launcher.log_rotation)",
        f"{python} -m envrl.launcher.log_rotation {rotate} &",
        "NAME[$!]=log-rotation",
    ]
    for i, command in plan.start_order:
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


def write_sbatch(rl: RLConfig) -> Path:
    """Store the run's config and its batch script under `<output_dir>/slurm/`; the script's path."""
    layout.slurm_dir(rl.output_dir).mkdir(parents=True, exist_ok=True)
    layout.logs_dir(rl.output_dir).mkdir(parents=True, exist_ok=True)  # SLURM opens the job's log there
    stored = layout.slurm_config_file(rl.output_dir)
    kept = rl.model_copy()
    kept.__pydantic_fields_set__ = rl.model_fields_set - {"clean"}
    stored.write_text(config_to_toml(kept, only_set=True))
    script = layout.slurm_script_file(rl.output_dir)
    script.write_text(sbatch_script(rl, stored.resolve()))
    return script


def main(argv: Sequence[str] | None = None) -> None:
    """The batch script's first step: write each process's config for the job's hosts."""
    parser = argparse.ArgumentParser(prog="python -m envrl.launcher.slurm", description=main.__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run's stored config (slurm/rl.toml)")
    parser.add_argument("--hosts", required=True, help="the job's hosts, comma-separated, in node order")
    args = parser.parse_args(argv)
    plan = plan_job(resolve_config(RLConfig, [args.config]), args.hosts.split(","))
    write_job_files(plan)
    for i, host in enumerate(plan.hosts):
        print(f"host {i} ({host.host}): {', '.join(command.name for command in host.commands)}")


if __name__ == "__main__":
    main()
