"""`trainer --config x.toml`, alone or under torchrun: exit 0 after `max_steps`, 143 on SIGTERM once its last trained
step is checkpointed, 2 on a config error, 1 on any failure after one error line naming the step and file."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import os
import signal
import sys
from collections.abc import Sequence

import transformers
from loguru import logger

from envrl.config import load_config
from envrl.data.samples import BatchError
from envrl.runtime.cli import check_model, one_line_errors
from envrl.telemetry.log import LogConfig, setup_logging
from envrl.trainer.checkpoint import RankCountMismatch
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import TrainingError
from envrl.trainer.loop import Trainer, TrainerStopped
from envrl.trainer.model.lora import LoraError
from envrl.trainer.parallel import init_runtime, shutdown

STOPPED_EXIT = 128 + signal.SIGTERM
"""Exit status after a stop on SIGTERM (its checkpoint written), as a process killed by it."""
EXPECTED_FAILURES = (TrainingError, BatchError, FileNotFoundError, RankCountMismatch, LoraError)


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(TrainerConfig, argv, prog="trainer")
    with one_line_errors("trainer"):
        check_model(config.model.name)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        setup_logging(config.log, process="trainer")
    else:  # rank 0 speaks for the run; the others only report trouble, to the console
        setup_logging(LogConfig(level="WARNING"), process=f"trainer[{rank}]")
    transformers.utils.logging.disable_progress_bar()  # tqdm bars make unreadable log files
    runtime = None
    try:
        runtime = init_runtime(config)
        Trainer(config, runtime).run()
    except TrainerStopped as e:
        logger.warning(f"trainer {e}")
        sys.exit(STOPPED_EXIT)
    except EXPECTED_FAILURES as e:
        logger.error(f"trainer stopped: {e}")
        sys.exit(1)
    except Exception:
        logger.exception("trainer crashed")
        sys.exit(1)
    finally:
        if runtime is not None:
            shutdown(runtime)
    logger.info(f"trainer done: {config.max_steps} steps in {config.output_dir}")


if __name__ == "__main__":
    main()
