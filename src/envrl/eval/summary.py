"""What an `rl eval` says at its end: `eval/summary.json` (strict JSON: a metric without a value is
null), the table it prints, and whether too many of an env's rollouts failed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from envrl.data.layout import eval_summary_file
from envrl.runtime.atomic import atomic_write_text


def write_summary(output_dir: Path, summary: dict[str, dict[str, float]]) -> None:
    """`summary` (per env) to `eval/summary.json` under `output_dir`, atomically; a metric without
    a value, like the reward of an env whose rollouts all failed, is null."""
    finite = {env: {k: v if math.isfinite(v) else None for k, v in m.items()} for env, m in summary.items()}
    atomic_write_text(eval_summary_file(output_dir), json.dumps(finite, indent=1, allow_nan=False))


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    """One row per env: its grid, mean reward, error rate, pass@1, pass@r and mean tokens per rollout.

    Token columns show `-` when no rollout carried tokens (a chat client without `return_tokens`).
    """
    header = ["env", "tasks", "r", "reward", "errors", "pass@1", "pass@r", "completion tokens", "total tokens"]
    rows = []
    for name, m in summary.items():
        r = int(m["rollouts_per_example"])
        tokens = [f"{m[key]:.1f}" if m[key] else "-" for key in ("completion_len", "total_tokens")]
        rows.append(
            [
                name,
                f"{m['tasks']:.0f}",
                str(r),
                f"{m['reward']:.3f}",
                f"{m['error_rate']:.1%}",
                f"{m['pass@1']:.3f}",
                f"{m[f'pass@{r}']:.3f}",
                *tokens,
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    )


def failure(summary: dict[str, dict[str, float]], max_error_rate: float | None) -> str | None:
    """Why this eval failed (None: it did not): an env whose rollouts all failed, or more of them
    than `max_error_rate`."""
    for env, metrics in summary.items():
        rate = metrics["error_rate"]
        if (max_error_rate is None and rate >= 1.0) or (max_error_rate is not None and rate > max_error_rate):
            limit = "every rollout" if max_error_rate is None else f"more than --max-error-rate {max_error_rate:g}"
            return f"env {env}: {rate:.0%} of its rollouts failed ({limit})"
    return None
