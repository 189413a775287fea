"""What a step adds to its rollouts' numbers (why an env has no reward, what `seq_len` changed, where generated
tokens and rollout seconds went); token counts are of generated tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from envrl.data.samples import TrainingSample
from envrl.data.traces import Trace
from envrl.orchestrator.trajectories import SeqLenCounts
from envrl.telemetry.diagnosis import ROLLOUT_SECONDS


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


def rollout_seconds(groups: Sequence[tuple[float, Sequence[Trace]]]) -> dict[str, float]:
    """`perf/rollout_s/<part>`: the step's rollout-seconds in each part (`queue` from dispatch to the
    worker's start, `setup`, `model`, `tool <name>`, `scoring`), summed over the rollouts of
    `groups` (each: when it was dispatched, its traces); what the live step line splits the
    trainer's wait by (`telemetry/diagnosis.metrics_step`)."""
    parts: Counter[str] = Counter()
    for dispatched, traces in groups:
        for trace in traces:
            timing = trace.timing
            spans = [s for s in (timing.setup, timing.generation, timing.scoring) if s is not None]
            if not spans:
                continue
            parts["queue"] += max(spans[0].start - dispatched, 0.0)
            for name, span in (("setup", timing.setup), ("model", timing.generation), ("scoring", timing.scoring)):
                if span is not None:
                    parts[name] += span.duration
            for tool, seconds in timing.tools.items():
                parts[f"tool {tool}"] += seconds
                parts["model"] -= seconds
    return {f"{ROLLOUT_SECONDS}{part}": max(seconds, 0.0) for part, seconds in parts.items()}
