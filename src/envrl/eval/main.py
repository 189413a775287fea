"""`rl eval`: evaluate a served model on one or more envs, without training. `main` is the one
place where its errors become an exit code (2: its input, 1: the eval, 130: a signal)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter

from loguru import logger

from envrl.config import load_config
from envrl.data.layout import eval_results_root
from envrl.data.private_dir import own_output_dir
from envrl.envclient.client import EnvServerError
from envrl.envclient.plan import dry_run_text
from envrl.eval.config import EvalCommandConfig, EvalInputError, eval_envs
from envrl.eval.runner import Evaluation
from envrl.eval.summary import failure, format_summary
from envrl.runtime.cli import one_line_errors
from envrl.runtime.lifeline import die_with_parent
from envrl.runtime.process import ChildFailed
from envrl.telemetry.log import setup_logging
from envrl.telemetry.progress import LiveLines


def _dry_run_text(config: EvalCommandConfig) -> str:
    return dry_run_text("eval", config, eval_envs(config), config.output_dir)


async def _run(config: EvalCommandConfig, lines: LiveLines) -> tuple[dict[str, dict[str, float]], Counter[str]]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    evaluation = Evaluation(config, lines)
    return await evaluation.run(), evaluation.error_causes


def main(argv: list[str] | None = None) -> None:
    config = load_config(EvalCommandConfig, argv, prog="rl eval", dry_run=_dry_run_text)
    with one_line_errors("rl eval"):
        own_output_dir(config.output_dir)  # made 0700 (before its logs): what the model wrote is nobody else's
    lines = LiveLines()
    lines.use_for_stderr()
    setup_logging(config.log, process="eval")
    die_with_parent()
    try:
        with one_line_errors("rl eval", EvalInputError, EnvServerError):  # ConfigError: a mismatched server too
            summary, causes = asyncio.run(_run(config, lines))
    except ChildFailed as e:
        logger.error(f"eval failed: {e}")
        sys.exit(1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        logger.warning(
            f"eval stopped by a signal; finished rollouts are in {eval_results_root(config.output_dir)}: add --resume {config.output_dir}"
        )
        sys.exit(130)
    except Exception as e:
        logger.opt(exception=e).error(f"eval failed: {e}")
        sys.exit(1)
    print(format_summary(summary))
    if causes:
        top = "; ".join(f"{n}x {cause}" for cause, n in causes.most_common(3))
        logger.warning(f"{causes.total()} rollouts failed; most common causes: {top}")
    why = failure(summary, config.max_error_rate)
    if why is not None:
        logger.error(f"eval failed: {why}; results in {eval_results_root(config.output_dir)}")
        sys.exit(1)
    logger.success(f"results in {eval_results_root(config.output_dir)} (summary.json and one <env>.jsonl per env)")


if __name__ == "__main__":
    main()
