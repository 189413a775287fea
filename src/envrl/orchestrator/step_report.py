"""One train step's metrics line and console line: per env, every rollout of its groups; then the batch's reward,
errors, tokens, times and counters; a step that trains nothing, or a filling disk, warns."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from loguru import logger

from envrl.data.samples import TrainingSample
from envrl.data.traces import Trace
from envrl.orchestrator.policy import PolicyTracker
from envrl.orchestrator.retention import disk_use
from envrl.orchestrator.scheduler import Group
from envrl.orchestrator.stats import rollout_seconds, seq_len_note, token_metrics, why_unscored
from envrl.orchestrator.trajectories import SeqLenCounts
from envrl.telemetry.console import fmt_shares, outcome_note
from envrl.telemetry.metrics import MetricsSink
from envrl.telemetry.rollouts import rollout_metrics


def _traces_by_env(groups: list[Group]) -> dict[str, list[Trace]]:
    by_env: dict[str, list[Trace]] = {}
    for group in groups:
        by_env.setdefault(group.env.name, []).extend(group.traces)
    return by_env


def train_metrics(
    step: int,
    groups: list[Group],
    stale: list[Group],
    samples: list[TrainingSample],
    seq_counts: dict[str, SeqLenCounts],
    seconds: float,
) -> dict[str, Any]:
    """The step's `train/` metrics, per env and for the batch, its token counts and its speed."""
    metrics: dict[str, Any] = {}
    traces_by_env = _traces_by_env(groups)
    replaced_by_env: dict[str, list[Trace]] = {}
    for group in groups:
        replaced_by_env.setdefault(group.env.name, []).extend(group.replaced)
        metrics.setdefault(f"train/{group.env.name}/staleness", []).append(float(step - group.counted_step))
    total = sum(len(t) for t in traces_by_env.values())
    for name, traces in traces_by_env.items():
        metrics.update(rollout_metrics(f"train/{name}", traces, replaced_by_env[name]))
        metrics[f"train/{name}/share"] = len(traces) / max(total, 1)
        counts = seq_counts[name]
        metrics[f"train/{name}/seq_truncated"] = counts.truncated
        metrics[f"train/{name}/seq_dropped"] = counts.dropped
        metrics[f"train/{name}/seq_tokens_cut"] = counts.tokens_cut
    for key in [k for k in metrics if k.endswith("/staleness")]:
        metrics[key] = sum(metrics[key]) / len(metrics[key])
    all_traces = [t for traces in traces_by_env.values() for t in traces]
    good = [t.reward for t in all_traces if t.in_baseline]
    metrics.update(
        {
            "train/reward": sum(good) / len(good) if good else math.nan,
            "train/error_rate": sum(t.has_error for t in all_traces) / max(total, 1),
            "train/samples": len(samples),
            "train/trained_tokens": sum(sum(s.loss_mask) for s in samples),
            **token_metrics(
                step,
                [*all_traces, *(t for g in stale for t in g.traces)],
                [t for g in stale for t in g.traces],
                samples,
            ),
            "perf/step_time": seconds,
            "perf/rollouts_per_s": total / seconds if seconds > 0 else 0.0,
            **rollout_seconds([(g.dispatched, g.traces) for g in groups]),
        }
    )
    return metrics


class StepReport:
    """Logs each step's metrics to the run's sink and writes its console line."""

    def __init__(self, sink: MetricsSink, output_dir: Path, max_steps: int, counters: Counter[str]) -> None:
        self.sink = sink
        self.output_dir = output_dir
        self.max_steps = max_steps
        self.counters = counters

    def log(
        self,
        step: int,
        groups: list[Group],
        stale: list[Group],
        samples: list[TrainingSample],
        seconds: float,
        *,
        seq_counts: dict[str, SeqLenCounts],
        policy: PolicyTracker,
        inflight: int,
    ) -> None:
        metrics = train_metrics(step, groups, stale, samples, seq_counts, seconds)
        metrics.update(
            {
                "perf/wait_for_trainer": policy.waited,
                "policy_step": policy.current,
                "inflight": inflight,
                **{f"counters/{k}": v for k, v in self.counters.items()},
            }
        )
        disk = disk_use(self.output_dir)
        metrics["disk/run_gib"] = disk.run_bytes / 1024**3
        metrics["disk/free_gib"] = disk.free_bytes / 1024**3
        self.sink.log(step, metrics)
        if disk.low:
            logger.warning(f"step {step}: only {disk.describe()} left on the run's filesystem ({self.output_dir})")
        traces_by_env = _traces_by_env(groups)
        all_traces = [t for traces in traces_by_env.values() for t in traces]
        good = [t.reward for t in all_traces if t.in_baseline]
        if not samples:
            why = (
                why_unscored(all_traces)
                if not good
                else " (every scored group was dropped, equal rewards, or cut by seq_len)"
            )
            logger.warning(f"step {step} trains nothing{why}")
        total = len(all_traces)
        shares = {name: len(t) / max(total, 1) for name, t in traces_by_env.items()}
        logger.info(
            f"step {step}/{self.max_steps} | reward {metrics['train/reward']:.3f}{why_unscored(all_traces) if not good else ''} | "
            f"errors {metrics['train/error_rate']:.0%}{outcome_note(metrics)}{seq_len_note(seq_counts)} | "
            f"policy {policy.current} | in-flight {metrics['inflight']} | {seconds:.1f} s "
            f"(waited {policy.waited:.1f} s) | shares {fmt_shares(shares)} | {disk.describe()}"
        )
