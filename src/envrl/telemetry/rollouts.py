"""One env's rollout numbers and pass@k, alike for training and evaluation: rates over all rollouts, reward and
length statistics over error-free ones; a mean of nothing is NaN for the reward, 0 for the rest."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from statistics import fmean

from envrl.data.traces import OUTCOMES, Trace


def _mean(values: Sequence[float]) -> float:
    return fmean(values) if values else 0.0


def rollout_metrics(prefix: str, traces: Sequence[Trace], replaced: Sequence[Trace] = ()) -> dict[str, float]:
    """Reward, error/truncation rates, lengths and timings of one env's rollouts under `prefix/`,
    and `outcome/<outcome>`: how many ended each way (`Outcome`), counting also the failed
    attempts that refills `replaced`.

    `reward` is NaN when no rollout was scored (a mean of nothing is not 0).
    """
    good = [t for t in traces if t.in_baseline]
    n = max(len(traces), 1)
    rewards = [t.reward for t in good if t.reward is not None]
    metrics = {
        "rollouts": float(len(traces)),
        "reward": fmean(rewards) if rewards else math.nan,
        "error_rate": sum(t.has_error for t in traces) / n,
        "unscored_rate": sum(not t.has_error and t.reward is None for t in traces) / n,
        "truncation_rate": sum(t.is_truncated for t in traces) / n,
        "completion_len": _mean([float(t.completion_len) for t in good]),
        "total_tokens": _mean([float(t.total_tokens) for t in good]),
        "num_turns": _mean([float(t.num_turns) for t in good]),
    }
    outcomes = Counter(t.outcome for t in [*traces, *replaced])
    metrics.update({f"outcome/{outcome}": float(outcomes[outcome]) for outcome in OUTCOMES})
    for phase in ("generation", "scoring"):
        spans = [getattr(t.timing, phase) for t in good]
        metrics[f"time_{phase}"] = _mean([s.duration for s in spans if s is not None])
    names = sorted({name for t in good for name in t.metrics})
    for name in names:
        metrics[f"metric/{name}"] = _mean([t.metrics[name] for t in good if name in t.metrics])
    return {f"{prefix}/{key}": value for key, value in metrics.items()}


def pass_at_k(groups: Sequence[Sequence[Trace]], threshold: float, ks: Sequence[int] = ()) -> dict[str, float]:
    """pass@k for k = 1, r (the rollouts per task) and each of `ks`: the unbiased estimator
    1 - C(n - c, k) / C(n, k) per task (n rollouts, c of them with reward >= threshold), averaged
    over tasks; tasks with fewer than k rollouts are left out of pass@k."""
    passed = [sum(t.reward is not None and t.reward >= threshold for t in group) for group in groups if group]
    sizes = [len(group) for group in groups if group]
    r = max(sizes, default=1)
    out = {}
    for k in sorted({1, r, *ks}):
        estimates = [1.0 - math.comb(n - c, k) / math.comb(n, k) for n, c in zip(sizes, passed, strict=True) if n >= k]
        out[f"pass@{k}"] = _mean(estimates)
    return out
