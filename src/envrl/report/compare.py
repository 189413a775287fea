"""`rl report --compare RUN ...`: several runs' curves on one page, read only through `metrics.jsonl`; a run lacking
a key is left out of that curve (never drawn as 0), and `compare.md` holds the same numbers as the picture."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from envrl.runtime.atomic import atomic_write_text  # noqa: E402
from envrl.telemetry.metrics import Record, env_names, read_metrics, series  # noqa: E402

PANELS = (("train", "Train reward (batch mean)", "-o"), ("eval", "Eval reward (mean over eval tasks)", "s--"))
"""The metric prefix each panel draws `<prefix>/<env>/reward` from, its title and line style."""


@dataclass(frozen=True)
class Curves:
    """One run's reward curves: `(prefix, env) -> (steps, rewards)`."""

    label: str
    curves: dict[tuple[str, str], tuple[list[int], list[float]]]


def run_curves(records: list[Record], label: str) -> Curves:
    """Every `train/<env>/reward` and `eval/<env>/reward` series of a run's metrics lines."""
    curves = {}
    for prefix, _, _ in PANELS:
        for env in env_names(records, prefix):
            curves[(prefix, env)] = series(records, f"{prefix}/{env}/reward")
    return Curves(label, curves)


def read_runs(run_dirs: list[Path], labels: list[str] | None = None) -> list[Curves]:
    """The curves of each run directory, labelled by `labels` or by the directory's name.

    Raises FileNotFoundError naming a directory with no metrics lines (a typo, or a run that
    never finished a step), and ValueError when the labels do not pair with the runs."""
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs: give one label per run, in order")
    runs = []
    for i, run_dir in enumerate(run_dirs):
        records = read_metrics(run_dir)
        if not records:
            raise FileNotFoundError(f"{run_dir}: no metrics lines (not a run's output_dir, or no step finished)")
        runs.append(run_curves(records, labels[i] if labels else run_dir.name))
    return runs


def table(runs: list[Curves]) -> str:
    """compare.md: per panel and env, one row per step and one column per run (blank: not logged)."""
    parts = ["# Reward curves", ""]
    for prefix, title, _ in PANELS:
        envs = sorted({env for run in runs for (p, env) in run.curves if p == prefix})
        for env in envs:
            by_run = [dict(zip(*run.curves.get((prefix, env), ([], [])), strict=True)) for run in runs]
            steps = sorted({s for values in by_run for s in values})
            parts += [f"## {title}: {env}", "", "| step | " + " | ".join(r.label for r in runs) + " |"]
            parts.append("|---" * (len(runs) + 1) + "|")
            for step in steps:
                cells = [f"{values[step]:.3f}" if step in values else "" for values in by_run]
                parts.append(f"| {step} | " + " | ".join(cells) + " |")
            parts.append("")
    return "\n".join(parts)


def plot(runs: list[Curves]) -> bytes:
    """compare.png: a panel per prefix, a line per run and env, one colour per run."""
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(7, 3.4 * len(PANELS)), dpi=90)
    try:
        for ax, (prefix, title, style) in zip(axes, PANELS, strict=True):
            drawn = False
            for colour, run in enumerate(runs):
                for (p, env), (steps, values) in sorted(run.curves.items()):
                    if p == prefix and steps:
                        label = (
                            run.label if len({e for q, e in run.curves if q == prefix}) == 1 else f"{run.label} {env}"
                        )
                        ax.plot(steps, values, style, color=f"C{colour % 10}", label=label, markersize=4)
                        drawn = True
            if drawn:
                ax.legend(fontsize=7, loc="best")
            else:
                ax.text(0.5, 0.5, "no run logged this", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return buffer.getvalue()


def write_comparison(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Write `out/compare.png` and `out/compare.md` for the runs; returns the markdown's path."""
    runs = read_runs(run_dirs, labels)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.png", plot(runs))
    atomic_write_text(out / "compare.md", table(runs))
    return out / "compare.md"
