"""The report's PNG plots: every plot in `PLOTS` is written (an empty one says "no data yet"), each replaced in one
rename, so a page never shows half an image."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.axes import Axes  # noqa: E402

from envrl.runtime.atomic import atomic_write_text  # noqa: E402
from envrl.telemetry.metrics import Record, env_names, series  # noqa: E402
from envrl.telemetry.steps import PARTS, StepSplit  # noqa: E402


@dataclass(frozen=True)
class Run:
    """What the plots are drawn from."""

    records: list[Record]
    """`metrics.jsonl` lines."""
    splits: list[StepSplit]
    """Each step's wall time split by the time ledger."""
    env_times: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    """Per step and env, rollout-seconds per phase and tool (`timeline.env_times`)."""


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    draw: Callable[[Axes, Run], bool]
    """Draws on the axes; False when there was nothing to draw."""
    height: float = 3.6
    """Figure height in inches (a plot with a long legend below it needs more)."""


def _lines(ax: Axes, records: list[Record], keys: dict[str, str], style: str = "-") -> bool:
    drawn = False
    for key, label in keys.items():
        steps, values = series(records, key)
        if steps:
            ax.plot(steps, values, style, label=label, markersize=4)
            drawn = True
    return drawn


def _keys(*builders: Callable[[list[Record]], dict[str, str]]) -> Callable[[Axes, Run], bool]:
    def draw(ax: Axes, run: Run) -> bool:
        keys = {k: v for build in builders for k, v in build(run.records).items()}
        return _lines(ax, run.records, keys, "-o" if len(run.records) < 60 else "-")

    return draw


def _fixed(keys: dict[str, str]) -> Callable[[list[Record]], dict[str, str]]:
    return lambda records: keys


def _labelled(prefix: str, metric: str, label: str) -> Callable[[list[Record]], dict[str, str]]:
    """`{<prefix>/<env>/<metric>: "<label> <env>"}` for every env of the run."""
    return lambda records: {f"{prefix}/{env}/{metric}": f"{label} {env}" for env in env_names(records, prefix)}


def _time_split(ax: Axes, run: Run) -> bool:
    """Stacked bars of the parts of each step (the parts that are zero in every step left out)."""
    steps = [split.step for split in run.splits]
    if not steps:
        return False
    bottom = [0.0] * len(steps)
    colours = plt.get_cmap("tab20").colors
    for i, (part, label) in enumerate(PARTS.items()):
        values = [split.parts[part] for split in run.splits]
        if any(values):
            colour = "black" if part == "unaccounted" else colours[i % len(colours)]
            ax.bar(steps, values, bottom=bottom, label=label, color=colour)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    _clip(ax, steps, bottom, " s")
    return True


def _clip(ax: Axes, steps: list[int], values: list[float], unit: str = "") -> None:
    """Cut the y axis at twice the typical (90th percentile) value when a point is over three times
    it, and write each cut point's value at the top: one start-up step would flatten every other."""
    points = [(step, v) for step, v in zip(steps, values, strict=True) if not math.isnan(v)]
    if not points:
        return
    ordered = sorted(v for _, v in points)
    typical = ordered[(len(ordered) - 1) * 9 // 10]
    if not ordered[-1] > 3 * typical > 0:
        return
    top = 2 * typical
    ax.set_ylim(0, top)
    for step, value in points:
        if value > top:
            ax.text(step, top * 0.97, f"{value:.1f}{unit}", ha="center", va="top", fontsize=6, rotation=90,
                    backgroundcolor="white")  # fmt: skip


def _env_time(ax: Axes, run: Run) -> bool:
    """A line per (env, part): the step's rollout-seconds in setup, model generation, each tool by
    name and scoring, and the trainer's training seconds; a slow tool is a line with its name."""
    keys = sorted({(env, part) for envs in run.env_times.values() for env, parts in envs.items() for part in parts})
    style = "-o" if len(run.env_times) < 60 else "-"
    for env, part in keys:
        steps = sorted(step for step, envs in run.env_times.items() if part in envs.get(env, {}))
        label = part if env == part else f"{env}: {part}"
        ax.plot(steps, [run.env_times[step][env][part] for step in steps], style, label=label, markersize=4)
    ax.set_ylabel("seconds (summed over rollouts)")
    return bool(keys)


def _throughput(ax: Axes, run: Run) -> bool:
    """Trainer tokens/s on the left axis, rollouts/s (orchestrator) on a right one: scales apart.
    Each axis is clipped (`_clip`) above a warm-up outlier: the first steps' rollouts/s divides a
    batch that was ready early by a step time near zero."""
    drawn = _lines(ax, run.records, {"trainer/tokens_per_s": "trainer tokens/s"}, "-o")
    _clip(ax, *series(run.records, "trainer/tokens_per_s"))
    ax.set_ylabel("tokens/s")
    right = ax.twinx()
    if _lines(right, run.records, {"perf/rollouts_per_s": "rollouts/s (right axis)"}, "s--C1"):
        _clip(right, *series(run.records, "perf/rollouts_per_s"))
        right.set_ylabel("rollouts/s")
        right.legend(fontsize=7, loc="upper right")
        drawn = True
    return drawn


PLOTS = [
    Plot(
        "reward",
        "Reward per env (train: batch mean; eval: mean over eval tasks)",
        lambda ax, run: (
            _keys(_labelled("train", "reward", "train"))(ax, run)
            | _lines(ax, run.records, _labelled("eval", "reward", "eval")(run.records), "s--")
        ),
    ),
    Plot("mismatch_kl", "Trainer/inference mismatch KL", _keys(_fixed({"trainer/mismatch_kl": "mismatch KL"}))),
    Plot("entropy", "Entropy of trained tokens", _keys(_fixed({"trainer/entropy": "entropy"}))),
    Plot("grad_norm", "Gradient norm (before clipping)", _keys(_fixed({"trainer/grad_norm": "grad norm"}))),
    Plot(
        "clip_frac",
        "Clipped and masked token fractions",
        _keys(_fixed({"trainer/clip_frac": "clip fraction", "trainer/mask_frac": "mask fraction"})),
    ),
    Plot(
        "lengths",
        "Lengths (tokens, mean per rollout)",
        _keys(_labelled("train", "completion_len", "completion"), _labelled("train", "total_tokens", "total")),
    ),
    Plot(
        "rates",
        "Truncation and error rates",
        _keys(
            _labelled("train", "truncation_rate", "truncated"),
            _labelled("train", "error_rate", "errors"),
            _fixed({"train/error_rate": "errors (all envs)"}),
        ),
    ),
    Plot(
        "outcomes",
        "Rollouts per step that were not scored, by outcome and env (a refill's failed attempts included)",
        _keys(*(_labelled("train", f"outcome/{o}", o) for o in ("infra_error", "env_error", "truncated", "cancelled"))),
    ),
    Plot(
        "staleness",
        "Staleness (trainer step minus the policy step that sampled)",
        _keys(
            _fixed({"trainer/staleness_mean": "mean over samples", "trainer/staleness_max": "max over samples"}),
            _labelled("train", "staleness", "mean over groups,"),
        ),
    ),
    Plot(
        "throughput",
        "Throughput",
        _throughput,
    ),
    Plot("time_split", "Where each step's wall time went", _time_split, height=5.6),
    Plot("env_time", "Where each env's rollout time went: setup, model, each tool, scoring; and training", _env_time),
]


def write_plots(run: Run, out: Path) -> list[tuple[str, str]]:
    """Draw every plot into `out/<name>.png`; returns (file name, title) in page order."""
    written = []
    for plot in PLOTS:
        fig, ax = plt.subplots(figsize=(7, plot.height), dpi=90)
        try:
            if plot.draw(ax, run):
                ax.set_xlabel("step")
                ax.grid(alpha=0.3)
                if ax.get_legend() is None:
                    ax.legend(fontsize=7, loc="best")
            else:
                ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(plot.title, fontsize=10)
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
        finally:
            plt.close(fig)
        atomic_write_text(out / f"{plot.name}.png", buffer.getvalue())
        written.append((f"{plot.name}.png", plot.title))
    return written
