"""`orchestrator --config x.toml`: run the orchestrator against an inference server and env servers.

Env configs with an `address` connect to servers somebody else started; the others are spawned
as sidecar env servers and stopped when the orchestrator exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from loguru import logger

from envrl.config import load_config
from envrl.log import setup_logging
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator
from envrl.process import die_with_parent


async def _run(config: OrchestratorConfig) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    await Orchestrator(config).run()


def main(argv: list[str] | None = None) -> None:
    config = load_config(OrchestratorConfig, argv, prog="orchestrator")
    setup_logging(config.log, process="orchestrator")
    die_with_parent()
    try:
        asyncio.run(_run(config))
    except (KeyboardInterrupt, asyncio.CancelledError):
        logger.warning("orchestrator stopped by a signal; env servers it spawned were shut down")
        sys.exit(130)
    except Exception as e:
        logger.opt(exception=e).error(f"orchestrator failed: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
