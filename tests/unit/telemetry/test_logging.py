"""setup_logging routes loguru and stdlib records (with their own handlers) to one file."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from envrl.telemetry.log import LogConfig, Throttle, setup_logging


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "logs" / "trainer.log"
    setup_logging(LogConfig(level="INFO", file=path), process="trainer")
    yield path
    logger.remove()  # closes the file sink
    logging.basicConfig(handlers=[], force=True)


def read(path: Path) -> str:
    logger.complete()
    return path.read_text()


def test_loguru_and_stdlib_records_reach_the_file_tagged_with_process(log_file: Path) -> None:
    logger.info("loguru says hi")
    logging.getLogger("vllm.engine").warning("vllm says hi")
    text = read(log_file)
    assert "loguru says hi" in text and "vllm says hi" in text
    assert all(" trainer " in line for line in text.splitlines())


def test_library_handlers_are_replaced_by_interception(log_file: Path) -> None:
    own_handler_output: list[str] = []
    library = logging.getLogger("transformers")
    library.propagate = False
    library.addHandler(
        logging.StreamHandler(type("S", (), {"write": own_handler_output.append, "flush": lambda: None})())
    )
    setup_logging(LogConfig(level="INFO", file=log_file), process="trainer")
    library.warning("from transformers")
    assert "from transformers" in read(log_file)
    assert own_handler_output == []


def test_level_filters_both_loguru_and_stdlib(log_file: Path) -> None:
    logger.debug("hidden loguru debug")
    logging.getLogger("urllib3").debug("hidden urllib3 debug")
    logger.warning("visible warning")
    text = read(log_file)
    assert "visible warning" in text
    assert "hidden" not in text


def test_stdlib_record_keeps_caller_location(log_file: Path) -> None:
    logging.getLogger("zmq").error("located")
    line = next(line for line in read(log_file).splitlines() if "located" in line)
    assert "test_logging" in line


def test_a_throttle_reports_a_burst_per_window_and_counts_what_it_held_back() -> None:
    throttle = Throttle(burst=2, window=3600.0)
    assert [throttle.suffix() for _ in range(5)] == ["", "", None, None, None]
    throttle.window_start -= 3600.0  # the window has passed
    assert throttle.suffix() == " (3 more since the last report, not logged)", "a new window's first report counts"


def test_tracebacks_in_the_log_leave_out_local_variables(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    setup_logging(LogConfig(file=log), process="test")
    secret = "sk-do-not-log-me"  # a diagnosing traceback prints the values on the failing line
    try:
        raise ValueError("boom", len(secret))
    except ValueError as e:
        logger.opt(exception=e).error("failed")
    assert "boom" in log.read_text() and "sk-do-not-log-me" not in log.read_text()
