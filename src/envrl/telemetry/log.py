"""One logging setup: after `setup_logging`, everything a process logs (loguru or stdlib `logging`) goes to the same
sinks in one format: the console (coloured only on a TTY) and its log file."""

from __future__ import annotations

import inspect
import logging
import sys
import time
from pathlib import Path
from typing import Literal

from loguru import logger

from envrl.config import BaseConfig

LogLevel = Literal["TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"]

# Libraries that install their own handlers; we strip those so their records reach loguru once.
THIRD_PARTY_LOGGERS = ("vllm", "transformers", "urllib3", "zmq", "asyncio", "httpx", "wandb", "torch")
CHATTY_LOGGERS = ("httpx", "httpcore", "matplotlib")
"""Log routine work at INFO (every HTTP request; matplotlib its font cache, at a fresh install's
first report); we keep their warnings only."""

CONSOLE_FORMAT = "<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> <cyan>{extra[process]}</cyan> {message}"
FILE_FORMAT = "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {extra[process]} {name}:{line} {message}"


class LogConfig(BaseConfig):
    level: LogLevel = "INFO"
    """Lowest level written to the console and the log file."""
    file: Path | None = None
    """Also write this process's log to this file (appended; parent dirs are created)."""


class InterceptHandler(logging.Handler):
    """Forwards stdlib log records to loguru, keeping the original caller's location."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        frame, depth = inspect.currentframe(), 0
        while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame, depth = frame.f_back, depth + 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, record.getMessage())


def setup_logging(config: LogConfig, process: str) -> None:
    """Route all logging of this process to the console and `config.file`, tagged `process`."""
    logger.remove()
    logger.configure(extra={"process": process})
    # diagnose=False: tracebacks without the values of local variables (they may hold secrets,
    # and a large request repeated in every traceback fills a disk).
    logger.add(sys.stderr, level=config.level, format=CONSOLE_FORMAT, colorize=sys.stderr.isatty(), diagnose=False)
    if config.file is not None:
        config.file.parent.mkdir(parents=True, exist_ok=True)
        logger.add(config.file, level=config.level, format=FILE_FORMAT, colorize=False, diagnose=False)

    logging.basicConfig(handlers=[InterceptHandler()], level=logger.level(config.level).no, force=True)
    for name in THIRD_PARTY_LOGGERS:
        stdlib_logger = logging.getLogger(name)
        stdlib_logger.handlers = []
        stdlib_logger.propagate = True
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logger.level(config.level).no))


class Throttle:
    """At most `burst` reports per `window` seconds; the rest are counted, so a flood of one
    failure (one per hostile request) cannot fill the log. `allow()` says whether to report now,
    and how many were held back since the last report."""

    def __init__(self, burst: int = 10, window: float = 60.0) -> None:
        self.burst = burst
        self.window = window
        self.window_start = -window
        self.reported = 0
        self.held_back = 0

    def allow(self) -> tuple[bool, int]:
        now = time.monotonic()
        if now - self.window_start >= self.window:
            self.window_start, self.reported = now, 0
        if self.reported >= self.burst:
            self.held_back += 1
            return False, 0
        self.reported += 1
        held, self.held_back = self.held_back, 0
        return True, held

    def suffix(self) -> str | None:
        """None when this report is held back; else what to append to the logged line: empty, or
        how many reports since the last one were not logged."""
        report, held_back = self.allow()
        if not report:
            return None
        return f" ({held_back} more since the last report, not logged)" if held_back else ""
