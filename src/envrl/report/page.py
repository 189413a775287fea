"""The report page: needs no server or network; a step file is written before the index that lists it, each in one
rename, and rewritten only when its rollout lines or batch changed."""

from __future__ import annotations

import json
import math
import time
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

from envrl.data.layout import batch_dir
from envrl.report.data import Detokenizer, Rollout
from envrl.runtime.atomic import atomic_write_text

STEP_FORMAT = 3
"""Version of the step files' content: a report made by a newer envrl rewrites older ones."""
STEP_FUNCTION = "envrlStep"
"""What a step file calls with its data: `envrlStep({...});`."""


def _js(value: Any) -> str:
    """`value` as a JavaScript literal (NaN and Infinity are JS globals) that holds no `<`, `>` or
    `&`: inside the page's `<script>` the HTML parser sees none of `</script>`, `<!--` or `-->`,
    so no text (a model's completion in a log line) can end the script or keep it from ending."""
    text = json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    shown = {"role": message.get("role", "?"), "content": content if isinstance(content, str) else json.dumps(content)}
    if message.get("tool_calls"):
        shown["tool_calls"] = json.dumps(message["tool_calls"])
    return shown


def _logprob(value: float, trained: int) -> float | None:
    return round(value, 4) if trained and math.isfinite(value) else None


def rollout_view(rollout: Rollout, detok: Detokenizer, vocab: dict[int, str]) -> dict[str, Any]:
    """What the trace browser shows of one rollout; token texts go to the step's shared `vocab`."""
    trace = rollout.trace
    branches = []
    for branch in trace.branches:
        if branch.turns:
            last = branch.turns[-1]
            branches.append([_message(m) for m in [*last.prompt, last.response]])
    samples = []
    for sample in rollout.samples:
        for token in sample.input_ids:
            if token not in vocab:
                vocab[token] = detok(token)
        samples.append(
            {
                "ids": sample.input_ids,
                "mask": sample.loss_mask,
                "logprobs": [
                    _logprob(lp, m) for lp, m in zip(sample.inference_logprobs, sample.loss_mask, strict=True)
                ],
                "advantage": sample.advantage,
            }
        )
    timing = {
        phase: round(span.duration, 3)
        for phase in ("setup", "generation", "scoring")
        if (span := getattr(trace.timing, phase)) is not None
    }
    return {
        "split": rollout.split,
        "env": rollout.env,
        "task": trace.task.idx,
        "policy_step": rollout.fields.get("policy_step"),
        "reward": trace.reward,
        "metrics": trace.metrics,
        "stop_reason": trace.stop_reason,
        "truncated": trace.is_truncated,
        "outcome": trace.outcome,
        "error": trace.error.model_dump() if trace.error else None,
        "timing": timing,
        "branches": branches,
        "trailing": [_message(m) for m in trace.trailing_messages],
        "samples": samples,
    }


def fingerprint(output_dir: Path, step: int, lines: list[str]) -> str:
    """Changes whenever the step's rollout lines or its batch do (a resume rewrites both)."""
    batch = batch_dir(output_dir, step)
    crc = zlib.crc32("".join(lines).encode())
    return f"v{STEP_FORMAT}:{len(lines)}:{crc:08x}:{batch.stat().st_mtime_ns if batch.is_dir() else 'no-batch'}"


def write_step(path: Path, step: int, rollouts: list[Rollout], detok: Detokenizer) -> None:
    vocab: dict[int, str] = {}
    views = [rollout_view(r, detok, vocab) for r in rollouts]
    payload = {"step": step, "vocab": {str(k): v for k, v in vocab.items()}, "rollouts": views}
    atomic_write_text(path, f"{STEP_FUNCTION}({_js(payload)});\n")


def step_summary(step: int, rollouts: list[Rollout]) -> dict[str, Any]:
    """The index's line for a step: its envs and how many rollouts each (an env's eval rollouts
    apart, as `<env> (eval)`: one declared env serves both splits), samples, errors, and per env the
    rollouts that were not scored, by outcome (`{env: {outcome: count}}`)."""
    envs: dict[str, int] = {}
    outcomes: dict[str, dict[str, int]] = {}
    for rollout in rollouts:
        key = rollout.env if rollout.split == "train" else f"{rollout.env} ({rollout.split})"
        envs[key] = envs.get(key, 0) + 1
        if (outcome := rollout.trace.outcome) != "scored":
            counts = outcomes.setdefault(key, {})
            counts[outcome] = counts.get(outcome, 0) + 1
    return {
        "step": step,
        "envs": envs,
        "rollouts": sum(r.split == "train" for r in rollouts),
        "eval": sum(r.split == "eval" for r in rollouts),
        "samples": sum(len(r.samples) for r in rollouts),
        "errors": sum(r.trace.has_error for r in rollouts),
        "outcomes": outcomes,
    }


def write_index(
    path: Path, run_name: str, plots: list[tuple[str, str]], steps: list[dict[str, Any]], headline: dict[str, Any]
) -> Path:
    template = resources.files("envrl.report").joinpath("index.html").read_text()
    index = {
        "run": run_name,
        "headline": headline,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "plots": [{"file": f"plots/{name}", "title": title} for name, title in plots],
        "steps": steps,
    }
    atomic_write_text(path, template.replace("/*INDEX*/null", _js(index)))
    return path
