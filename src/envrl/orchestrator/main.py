"""`orchestrator --config x.toml`: runs against an inference server and env servers, spawning as sidecars (stopped
at exit) the envs without an `address`, as `--dry-run` prints them."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import asyncio
import signal
import sys

from loguru import logger

from envrl.config import load_config
from envrl.data.private_dir import own_output_dir
from envrl.envclient.client import EnvServerError
from envrl.envclient.handles import EnvUnavailable
from envrl.envclient.plan import dry_run_text
from envrl.model.inference import ServerNotReady
from envrl.orchestrator.checks import CheckFailed
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator, orchestrator_envs
from envrl.runtime.cli import check_model, one_line_errors
from envrl.runtime.lifeline import parent_pid
from envrl.runtime.restarts import NO_RESTART_EXIT
from envrl.telemetry.console import RunConsole
from envrl.telemetry.log import setup_logging
from envrl.telemetry.progress import LiveLines


async def _run(config: OrchestratorConfig) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    await Orchestrator(config).run()


EXPECTED = (ServerNotReady, EnvServerError)
"""Wiring mistakes besides `ConfigError` (an env server with another model client is one): a
server that never answered at start; each one line, exit 2."""


def _dry_run_text(config: OrchestratorConfig) -> str:
    return dry_run_text("orchestrator", config, orchestrator_envs(config), config.output_dir)


def main(argv: list[str] | None = None) -> None:
    config = load_config(OrchestratorConfig, argv, prog="orchestrator", dry_run=_dry_run_text)
    with one_line_errors("orchestrator"):
        check_model(config.model.name)  # its tokenizer renders every train rollout: fail now, not after the waits
        own_output_dir(config.output_dir)  # by hand: made 0700; under rl: rl made it, and it is ours
    console = None
    if parent_pid() is None:  # run by hand, not by rl
        lines = LiveLines()
        lines.use_for_stderr()
        console = RunConsole(config.output_dir, config.max_steps, stream=lines, ends_with="orchestrator")
    setup_logging(config.log, process="orchestrator")
    try:
        if console is not None:
            console.start()
        with one_line_errors("orchestrator", *EXPECTED):
            asyncio.run(_run(config))
    except (KeyboardInterrupt, asyncio.CancelledError):
        logger.warning("orchestrator stopped by a signal; env servers it spawned were shut down")
        sys.exit(130)
    except CheckFailed as e:
        logger.error(f"orchestrator stopped by a check: {e}")
        sys.exit(NO_RESTART_EXIT)  # a resumed run would fail the same check again
    except EnvUnavailable as e:  # a server lost for good: not a bug, but a restart may find it back
        logger.error(f"orchestrator stopped: {e}")
        sys.exit(1)
    except Exception as e:
        logger.opt(exception=e).error(f"orchestrator failed: {e}")
        sys.exit(1)
    finally:
        if console is not None:
            console.stop()


if __name__ == "__main__":
    main()
