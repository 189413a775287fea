"""Where each step's wall time went: every instant of a step is given to exactly one part of `PARTS`, so the parts
sum to the wall time (`unaccounted`: no span explains it); and each env's rollout seconds per phase and tool."""

from __future__ import annotations

from dataclasses import dataclass

from envrl.telemetry.ledger import LedgerSpan

PARTS = {
    "generation": "rollout generation (inference)",
    "scoring": "rollout scoring (env workers)",
    "setup": "rollout setup (env workers)",
    "env_queue": "rollouts queued (dispatch to env worker)",
    "rollout_other": "waiting on rollouts, none in a phase",
    "dispatch": "orchestrator dispatch",
    "startup": "orchestrator start-up (inference, env servers)",
    "wait_policy": "orchestrator waits for the policy (async bound)",
    "reload_weights": "weight reload (inference pause)",
    "batching": "batching (trajectories, advantages, publish)",
    "batch_poll": "trainer notices the published batch (poll)",
    "read_batch": "trainer reads the batch",
    "compute": "training (forward, backward, optimizer)",
    "publish": "weight publish",
    "checkpoint": "checkpoint",
    "log": "trainer metrics and log",
    "unaccounted": "unaccounted",
}
"""The parts of a step's wall time, bottom to top of the stacked chart."""

TRAINER_OWN = ("read_batch", "compute", "publish", "checkpoint", "log")
"""Trainer spans that are the step's own work; the rest of the step it waits for the batch."""
ORCHESTRATOR_ORDER = ("reload_weights", "wait_policy", "batching", "dispatch", "startup", "wait_rollouts")
"""What the orchestrator was doing, innermost first (`dispatch` runs inside `wait_rollouts`)."""
ROLLOUT_ORDER = ("generation", "scoring", "setup", "env_queue")
"""While the orchestrator waits on rollouts: the phase that any rollout is in, first match wins."""


TRAINING = "training"
"""The `env_times` key of the trainer's compute (forward, backward, optimizer) per step."""


def env_times(spans: list[LedgerSpan]) -> dict[int, dict[str, dict[str, float]]]:
    """`{step: {env: {part: seconds}}}`: each env's rollout-seconds (summed over its rollouts, which
    overlap: not wall time) in `setup` (a tool env's instance, its sandbox's start), `model`
    (generation minus tool calls), `tool <name>` per tool and `scoring`; and
    `{step: {"training": {"training": seconds}}}`, the trainer's compute. Rollout spans without an
    env (a ledger of an older envrl) are left out."""
    out: dict[int, dict[str, dict[str, float]]] = {}

    def add(step: int, env: str, part: str, seconds: float) -> None:
        parts = out.setdefault(step, {}).setdefault(env, {})
        parts[part] = parts.get(part, 0.0) + seconds

    for span in spans:
        extra = span.model_extra or {}
        if span.process == "trainer" and span.name == "compute":
            add(span.step, TRAINING, TRAINING, span.duration)
        env = extra.get("env")
        if not isinstance(env, str):
            continue
        if span.name in ("setup", "scoring"):
            add(span.step, env, span.name, span.duration)
        elif span.name == "generation":
            add(span.step, env, "model", span.duration)
        elif span.name == "rollout":
            for tool, seconds in (extra.get("tools") or {}).items():
                add(span.step, env, f"tool {tool}", seconds)
                add(span.step, env, "model", -seconds)  # tool calls run inside the generation span
    return out


@dataclass(frozen=True)
class StepSplit:
    step: int
    start: float
    end: float
    parts: dict[str, float]
    """Seconds per key of `PARTS`; they sum to `end - start`."""

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def accounted(self) -> float:
        """The share of the wall time a span explains (1.0 for an empty step)."""
        return 1.0 - self.parts["unaccounted"] / self.wall if self.wall > 0 else 1.0


def _orchestrator_name(span: LedgerSpan) -> str | None:
    if span.name == "reload_weights" or span.process == "orchestrator":
        return "startup" if span.name == "start" else span.name
    return None


def _part(
    t: float, own: list[LedgerSpan], wait: list[LedgerSpan], published: float | None, around: list[LedgerSpan]
) -> str:
    """The part instant `t` of a step belongs to."""
    for span in own:
        if span.start <= t < span.end:
            return span.name
    if not any(span.start <= t < span.end for span in wait):
        return "unaccounted"
    if published is not None and t >= published:
        return "batch_poll"
    active = [span for span in around if span.start <= t < span.end]
    doing = {name for span in active if (name := _orchestrator_name(span))}
    for name in ORCHESTRATOR_ORDER:
        if name in doing and name != "wait_rollouts":
            return name
    if "wait_rollouts" not in doing:
        return "unaccounted"
    phases = {span.name for span in active if span.process != "orchestrator"}
    return next((name for name in ROLLOUT_ORDER if name in phases), "rollout_other")


def step_splits(spans: list[LedgerSpan]) -> list[StepSplit]:
    """Each trainer step's wall time split into `PARTS`, oldest step first."""
    trainer: dict[int, list[LedgerSpan]] = {}
    for span in spans:
        if span.process == "trainer":
            trainer.setdefault(span.step, []).append(span)
    published = {s.step: s.end for s in spans if s.process == "orchestrator" and s.name == "batching"}
    splits, previous_end = [], None
    for step in sorted(trainer):
        mine = trainer[step]
        wait = [s for s in mine if s.name == "wait_batch"]
        start = previous_end if previous_end is not None else min(s.start for s in mine)
        end = max(s.end for s in mine)
        previous_end = end
        own = [s for s in mine if s.name in TRAINER_OWN]
        around = [s for s in spans if s.process != "trainer" and s.end > start and s.start < end]
        cuts = sorted({start, end, *(t for s in [*mine, *around] for t in (s.start, s.end) if start < t < end)})
        parts = dict.fromkeys(PARTS, 0.0)
        for a, b in zip(cuts, cuts[1:], strict=False):
            parts[_part((a + b) / 2, own, wait, published.get(step), around)] += b - a
        splits.append(StepSplit(step, start, end, parts))
    return splits
