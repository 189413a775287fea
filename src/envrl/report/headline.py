"""The report's headline: `headline` only reads, leaving out what a missing file would say (never raises); a failed
run names its failed process, exit code and log tail, a stalled run its stall dumps; the checks that fired and what
the run waits for are listed."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from envrl.data.layout import eval_results_root, eval_summary_file, metrics_file, process_config_file, stall_dump_file
from envrl.data.summary import read_summary
from envrl.telemetry.advice import Diagnosis, diagnose_run
from envrl.telemetry.metrics import checks_fired, read_metrics

LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 64 * 1024
"""The failure box shows at most this many lines from the end of the failed process's log."""


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of `path` (from its last bytes only), or '' when it cannot be read."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def log_head(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The first `lines` lines of `path` (from its first bytes only), or '' when it cannot be read."""
    try:
        with path.open("rb") as f:
            text = f.read(LOG_TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[:lines])


def is_eval_dir(output_dir: Path) -> bool:
    """An `rl eval` output dir: results under `eval/` and no `metrics.jsonl` of a training run."""
    root = eval_results_root(output_dir)
    return not metrics_file(output_dir).exists() and root.is_dir() and any(root.glob("*.jsonl"))


def headline(output_dir: Path) -> dict[str, Any]:
    """The facts the page opens with; `kind` is `run` or `eval`."""
    if is_eval_dir(output_dir):
        results = _json(eval_summary_file(output_dir))
        envs = sorted(p.stem for p in eval_results_root(output_dir).glob("*.jsonl"))
        return {"kind": "eval", "envs": envs, "eval": results}
    config = _toml(process_config_file(output_dir, "orchestrator"))
    tables = [e for e in config.get("envs", []) if isinstance(e, dict)]
    envs = [e.get("name") or e.get("id") for e in tables if e.get("train", True)]
    # `eval_envs`: runs written before eval envs moved under `orchestrator.eval.env`; an eval table
    # names its env (`env`) since envs are declared once, in `envs`
    eval_tables = config.get("eval", {}).get("env") or config.get("eval_envs", [])
    eval_envs = [e.get("env") or e.get("name") or e.get("id") for e in eval_tables if isinstance(e, dict)]
    summary = read_summary(output_dir)
    facts: dict[str, Any] = {
        "kind": "run",
        "model": config.get("model", {}).get("name"),
        "envs": envs,
        "eval_envs": eval_envs,
        "max_steps": config.get("max_steps"),
        **{key: summary.get(key) for key in ("status", "reason", "steps_done", "wall_time_s", "final_weights")},
        "eval_reward": summary.get("eval_reward") or {},
    }
    facts["checks"] = summary.get("checks") if "checks" in summary else checks_fired(read_metrics(output_dir))
    facts["waiting_for"] = waiting_for(summary, output_dir)
    dumps = sorted(stall_dump_file(output_dir, 0).parent.glob("step_*.txt"), key=lambda p: p.stat().st_mtime)
    facts["stalls"] = [{"file": str(p), "head": log_head(p)} for p in dumps]
    if summary.get("status") == "failed":
        log = summary.get("failed_log")
        facts["failure"] = {
            "process": summary.get("failed_process"),
            "exit_code": summary.get("exit_code"),
            "error": summary.get("error"),
            "log": log,
            "log_tail": log_tail(Path(log)) if log else "",
        }
    return facts


def waiting_for(summary: dict[str, Any], output_dir: Path) -> dict[str, str] | None:
    """The diagnosis as one line (the best advice, or the bound when none is due) and its full text:
    the summary's, or (a live run) the run's own files'."""
    try:
        found = [Diagnosis.model_validate(d) for d in summary["diagnosis"]]
    except (KeyError, TypeError, ValueError):
        found = diagnose_run(output_dir)
    if not found:
        return None
    first = found[0]
    if first.advice:
        best = first.advice[0]
        line = f"change {best.setting}: {best.change} (expected {best.speedup:.2f}x steps/min; bound by {first.bound})"
    else:
        line = f"bound by {first.bound} {first.bound_share:.0%}; no setting advised (balanced enough)"
    return {"line": line, "text": "\n".join(line for d in found for line in d.lines())}
