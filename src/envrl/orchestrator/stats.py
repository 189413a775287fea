"""Per-env numbers of a step's rollouts (train) or of an evaluation, as flat metric dicts, and
where a step's generated tokens went.

Guarantee: every rate is over all rollouts of that env, errored ones included; reward and
length statistics are over the rollouts without errors only. Token counts are of generated
(completion) tokens: `generated` = every rollout that arrived for the step, `stale` = those of
rollouts dropped as stale (the loop's `train/trained_tokens` counts those in its samples).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import fmean

from envrl.data.samples import TrainingSample
from envrl.data.traces import OUTCOMES, Trace
from envrl.orchestrator.trajectories import SeqLenCounts


def _mean(values: Sequence[float]) -> float:
    return fmean(values) if values else 0.0


def why_unscored(traces: Sequence[Trace]) -> str:
    """Why none of `traces` has a reward, for a log line: the error types, the rollouts that never
    reached the model (by stop reason) and the other unscored ones."""
    if not traces:
        return " (no rollouts)"
    errors = Counter(t.error.type for t in traces if t.error is not None)
    unscored = [t for t in traces if t.error is None and t.reward is None]
    no_turn = Counter(t.stop_reason for t in unscored if t.num_turns == 0 and t.stop_reason)
    other = len(unscored) - no_turn.total()
    parts = [f"{n} {kind}" for kind, n in errors.most_common()]
    parts += [f"{n} without a model turn ({reason})" for reason, n in no_turn.most_common()]
    parts += [f"{other} without reward"] if other else []
    return f" (no scored rollout: {', '.join(parts)})"


def seq_len_note(counts: Mapping[str, SeqLenCounts]) -> str:
    """`| seq_len: env truncated 3, dropped 1` for the envs whose samples `seq_len` changed."""
    changed = [
        f"{name} truncated {c.truncated}, dropped {c.dropped}" for name, c in counts.items() if c.truncated or c.dropped
    ]
    return f" | seq_len: {'; '.join(changed)}" if changed else ""


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


def token_metrics(
    step: int, arrived: Sequence[Trace], stale: Sequence[Trace], samples: Sequence[TrainingSample]
) -> dict[str, float]:
    """Step `step`'s generated tokens: `tokens/generated` (of `arrived`, the batched rollouts and
    the finished ones dropped as stale), `tokens/stale` (of `stale`), the trained
    ones per policy lag (`tokens/lag_<k>`: sampled by policy step - k) and the samples whose
    trained tokens come from more than one policy (`samples_spanning_update`: a weight reload
    came in the middle of their rollout)."""
    lags: Counter[int] = Counter()
    spanning = 0
    for sample in samples:
        steps = [p for p, m in zip(sample.policy_steps, sample.loss_mask, strict=True) if m]
        lags.update(step - p for p in steps)
        spanning += len(set(steps)) > 1
    metrics = {
        "tokens/generated": float(sum(t.completion_len for t in arrived)),
        "tokens/stale": float(sum(t.completion_len for t in stale)),
        "samples_spanning_update": float(spanning),
    }
    metrics.update({f"tokens/lag_{lag}": float(n) for lag, n in sorted(lags.items())})
    return metrics
