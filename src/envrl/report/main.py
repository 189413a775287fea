"""`python -m envrl.report OUTPUT_DIR` (and `rl report OUTPUT_DIR`): write `<output_dir>/report/`.

Guarantee: the report only reads the run directory (safe while the run goes on) and writes only
under `<output_dir>/report/`, every file in one rename and the index last, so `index.html` is
always a complete page whose plots and step files exist. Exit code 0 when written, 2 when
OUTPUT_DIR is not a run directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from loguru import logger

from envrl.atomic import atomic_write_text
from envrl.report.data import Detokenizer, read_metrics, read_train_rollouts, step_rollouts, tokenizer_source
from envrl.report.page import fingerprint, step_summary, write_index, write_step
from envrl.report.plots import write_plots


def report_dir(output_dir: Path) -> Path:
    """Where the report goes: `<output_dir>/report/`."""
    return Path(output_dir) / "report"


def write_report(output_dir: Path) -> Path:
    """Write (or bring up to date) the report of the run in `output_dir`; returns its index.html."""
    output_dir = Path(output_dir)
    if not (output_dir / "metrics.jsonl").exists() and not (output_dir / "rollouts").is_dir():
        raise FileNotFoundError(
            f"{output_dir} holds no metrics.jsonl and no rollouts/: not a run directory (or the run has not "
            "reached its first step yet); pass the output_dir of an `rl` or `orchestrator` run"
        )
    started = time.monotonic()
    out = report_dir(output_dir)
    plots = write_plots(read_metrics(output_dir), out / "plots")
    manifest_path = out / "steps" / "manifest.txt"
    written = (
        dict(line.split(" ", 1) for line in manifest_path.read_text().splitlines()) if manifest_path.exists() else {}
    )
    detok: Detokenizer | None = None
    summaries, fresh = [], 0
    for step, rollouts in sorted(read_train_rollouts(output_dir).items()):
        step_rollouts(output_dir, step, rollouts)
        mark = fingerprint(output_dir, step, rollouts)
        path = out / "steps" / f"step_{step}.js"
        if written.get(str(step)) != mark or not path.exists():
            detok = detok or Detokenizer(tokenizer_source(output_dir))
            write_step(path, step, rollouts, detok)
            written[str(step)] = mark
            fresh += 1
        summaries.append(step_summary(step, rollouts))
    if summaries:
        atomic_write_text(manifest_path, "".join(f"{k} {v}\n" for k, v in written.items()))
    index = write_index(out, output_dir.resolve().name, plots, summaries)
    logger.info(
        f"report of {output_dir}: {len(plots)} plots, {len(summaries)} steps ({fresh} written anew) "
        f"in {time.monotonic() - started:.1f} s -> {index}"
    )
    return index


def write_report_at_end(output_dir: Path) -> None:
    """The report at the end of an `rl` run: a failure is logged, never raised, so it cannot
    change the run's exit code."""
    try:
        write_report(output_dir)
    except Exception as e:
        logger.opt(exception=e).warning(f"the report of {output_dir} could not be written: {e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rl report", description="Write <OUTPUT_DIR>/report/: plots and a trace browser (open index.html)."
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the run directory (output_dir)")
    args = parser.parse_args(argv)
    from envrl.log import LogConfig, setup_logging

    setup_logging(LogConfig(), process="report")
    try:
        index = write_report(args.output_dir)
    except FileNotFoundError as e:
        print(f"rl report: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"open file://{index.resolve()}")
