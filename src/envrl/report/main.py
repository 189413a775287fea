"""`rl report OUTPUT_DIR`: reads the run directory only and writes only `<output_dir>/report/`, each file in one
rename and the index last, so `index.html` is always complete (the headline's checks and diagnosis also printed);
exit 2 when OUTPUT_DIR is no run or eval directory."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from loguru import logger

from envrl.data import layout
from envrl.report.data import (
    Detokenizer,
    eval_lines,
    parse_rollouts,
    results_lines,
    step_rollouts,
    tokenizer_source,
    train_lines,
)
from envrl.report.headline import headline, is_eval_dir
from envrl.report.page import fingerprint, step_summary, write_index, write_step
from envrl.report.plots import Run, write_plots
from envrl.report.timeline import chrome_trace
from envrl.runtime.atomic import atomic_write_text
from envrl.telemetry.ledger import read_ledger
from envrl.telemetry.metrics import read_metrics
from envrl.telemetry.steps import env_times, step_splits


def write_report(output_dir: Path) -> Path:
    """Write (or bring up to date) the report of the run in `output_dir`; returns its index.html."""
    output_dir = Path(output_dir)
    facts = headline(output_dir)
    marks = (layout.metrics_file(output_dir), layout.rollouts_root(output_dir), layout.summary_file(output_dir))
    if facts["kind"] == "run" and not any(mark.exists() for mark in marks):
        raise FileNotFoundError(
            f"{output_dir} holds no metrics.jsonl, rollouts/, summary.json or eval/<env>.jsonl: not a run "
            "directory (or the run has not reached its first step yet); pass the output_dir of an `rl`, "
            "`orchestrator` or `rl eval` run"
        )
    started = time.monotonic()
    spans = read_ledger(output_dir)
    records = read_metrics(output_dir)
    plots = (
        write_plots(Run(records, step_splits(spans), env_times(spans)), layout.report_plots_dir(output_dir))
        if records
        else []
    )
    atomic_write_text(layout.report_timeline_file(output_dir), json.dumps(chrome_trace(spans)))
    manifest_path = layout.report_manifest_file(output_dir)
    manifest = _read_manifest(manifest_path)
    detok: Detokenizer | None = None
    summaries, fresh = [], 0
    if is_eval_dir(output_dir):  # an `rl eval` dir: its results as one "step" of eval rollouts
        train, evals = {}, {0: results_lines(output_dir)}
    else:
        train, evals = train_lines(output_dir), eval_lines(output_dir)
    for step in sorted({*train, *evals}):
        lines, eval_ = train.get(step, []), evals.get(step, [])
        mark, path = fingerprint(output_dir, step, lines + eval_), layout.report_step_file(output_dir, step)
        entry = manifest.get(str(step))
        if (
            entry is None
            or (entry.get("mark") != mark and not _only_batch_pruned(entry.get("mark"), mark))
            or not path.exists()
        ):
            where = f"{output_dir}/rollouts, step {step}"
            rollouts = step_rollouts(output_dir, step, parse_rollouts(lines, where)) + parse_rollouts(
                eval_, where, split="eval"
            )
            detok = detok or Detokenizer(tokenizer_source(output_dir))
            write_step(path, step, rollouts, detok)
            entry = manifest[str(step)] = {"mark": mark, "summary": step_summary(step, rollouts)}
            fresh += 1
        summaries.append(entry["summary"])
    if fresh:
        atomic_write_text(manifest_path, json.dumps(manifest))
    index = write_index(layout.report_index_file(output_dir), output_dir.resolve().name, plots, summaries, facts)
    logger.info(
        f"report of {output_dir}: {len(plots)} plots, {len(summaries)} steps ({fresh} written anew) "
        f"in {time.monotonic() - started:.1f} s -> {index}"
    )
    return index


def _only_batch_pruned(old: str | None, new: str) -> bool:
    """The step's lines are unchanged and only its batch is gone (batch retention deleted it):
    the step file written while the batch existed keeps the tokens it showed."""
    return old is not None and new.endswith(":no-batch") and old.rsplit(":", 1)[0] == new.rsplit(":", 1)[0]


def _read_manifest(path: Path) -> dict[str, Any]:
    """What each step file was made from and its index line; empty (all steps rewritten) when
    missing or unreadable."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def write_report_at_end(output_dir: Path) -> None:
    """The report at the end of an `rl` run: a failure is logged, never raised, so it cannot
    change the run's exit code."""
    try:
        write_report(output_dir)
    except Exception as e:
        logger.opt(exception=e).warning(f"the report of {output_dir} could not be written: {e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rl report",
        description="Write <OUTPUT_DIR>/report/: a headline, plots and a trace browser (open index.html); "
        "OUTPUT_DIR is an `rl` run's output dir or an `rl eval` one (a trace browser of its rollouts). "
        "With --compare: several runs' reward curves on one page (compare.png, compare.md in --out).",
    )
    parser.add_argument(
        "output_dir",
        type=Path,
        nargs="?",
        metavar="OUTPUT_DIR",
        help="the run directory (output_dir) or an `rl eval` output dir",
    )
    parser.add_argument(
        "--compare", type=Path, nargs="+", metavar="RUN", help="run directories whose reward curves to draw together"
    )
    parser.add_argument("--out", type=Path, help="where --compare writes compare.png and compare.md")
    parser.add_argument("--labels", nargs="+", help="one legend label per --compare run (default: directory names)")
    args = parser.parse_args(argv)
    if (args.output_dir is None) == (args.compare is None):
        parser.error("give one OUTPUT_DIR, or --compare RUN [RUN ...] --out DIR")
    if args.compare and args.out is None:
        parser.error("--compare needs --out DIR (where compare.png and compare.md go)")
    from envrl.telemetry.log import LogConfig, setup_logging

    setup_logging(LogConfig(), process="report")
    if args.compare:
        from envrl.report.compare import write_comparison

        try:
            written = write_comparison(args.compare, args.out, args.labels)
        except (FileNotFoundError, ValueError) as e:
            print(f"rl report: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        print(f"wrote {written} and {written.with_suffix('.png')}")
        return
    try:
        index = write_report(args.output_dir)
    except FileNotFoundError as e:
        print(f"rl report: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    facts = headline(args.output_dir)
    for check in facts.get("checks") or []:
        when = "at start" if check["step"] is None else f"step {check['step']}"
        print(f"warning ({when}): {check['message']}")
    if facts.get("waiting_for"):
        print(f"what the run waits for: {facts['waiting_for']['line']}\n{facts['waiting_for']['text']}")
    print(f"open file://{index.resolve()}")
