"""Which role bounds a run's step rate: pure functions that split each trainer step into roles, from the time
ledger or (the live step line) its metrics lines; a step's role seconds sum to its wall time (docs/report.md)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from envrl.telemetry.ledger import LedgerSpan
from envrl.telemetry.metrics import metric_float
from envrl.telemetry.steps import TRAINER_OWN, TRAINING, env_times, step_splits

ROLES = {
    "generation": "generation (inference)",
    "env setup": "env setup (env workers)",
    "env tools": "env tools (env workers)",
    "env scoring": "env scoring (env workers)",
    "env queue": "rollouts queued for an env worker",
    "training": "training (forward, backward, optimizer, checkpoint)",
    "hand-off": "hand-off (weight publish and reload, batch read)",
    "orchestrator": "orchestrator (dispatch, batching, start-up)",
    "other": "unaccounted",
}
"""The roles a step's wall time is split into, with what each covers."""
ENV_ROLES = ("env setup", "env tools", "env scoring", "env queue")

ROLE_OF_PART = {
    "generation": "generation",
    "scoring": "env scoring",
    "setup": "env setup",
    "env_queue": "env queue",
    "rollout_other": "orchestrator",
    "dispatch": "orchestrator",
    "startup": "orchestrator",
    "batching": "orchestrator",
    "wait_policy": "hand-off",
    "reload_weights": "hand-off",
    "batch_poll": "hand-off",
    "read_batch": "hand-off",
    "publish": "hand-off",
    "compute": "training",
    "checkpoint": "training",
    "log": "training",
    "unaccounted": "other",
}
"""Each part of `telemetry/steps.PARTS` as the role it belongs to."""

ROLE_OF_ROLLOUT_PART = {"queue": "env queue", "setup": "env setup", "model": "generation", "scoring": "env scoring"}
"""The orchestrator's `perf/rollout_s/<part>` metrics as roles (`tool <name>`: env tools)."""
ROLLOUT_SECONDS = "perf/rollout_s/"
"""Prefix of the orchestrator's per-step rollout-seconds of each part (summed over the batch's rollouts)."""

DOMINANT = 0.5
"""A role holding at least this share of the step's wall time is named as its bound on the step line."""


@dataclass(frozen=True)
class StepTimes:
    """One trainer step: its wall time, the seconds of it each role held, and each pipeline
    stage's own busy seconds (they overlap under `max_async_level` > 0)."""

    step: int
    wall: float
    roles: dict[str, float]
    """Seconds per key of `ROLES`; they sum to `wall`."""
    trainer_busy: float
    """The trainer's own work (read, compute, publish, checkpoint, log)."""
    rollouts_busy: float
    """The orchestrator making this batch: collecting its rollouts, then batching (its stage)."""
    policy_wait: float
    """The orchestrator waiting for the trainer's policy and its reload before this batch."""
    reload: float = 0.0
    """Of `policy_wait`, the reload itself: the orchestrator's stage pays it every policy."""
    stage: dict[str, float] = field(default_factory=dict)
    """The rollout stage (`rollouts_busy`) split: seconds per rollout-side role (`generation`, the
    env roles, `orchestrator` for batching and instants no rollout phase explains)."""
    tools: dict[str, float] = field(default_factory=dict)
    """Seconds of `env tools` per tool name."""
    env_work: dict[str, float] = field(default_factory=dict)
    """Rollout-seconds of env work (setup, tools, scoring) per env: which env's workers are busiest."""
    queue_s: float = math.nan
    """Mean seconds a rollout of this batch waited between dispatch and its env worker's start."""
    rollout_env_s: float = math.nan
    """The least env work (setup, tools, scoring) of one rollout of this batch: what no number of
    workers shortens (a rollout that waited for a worker or a scorer counts its wait too)."""


def ledger_steps(spans: list[LedgerSpan]) -> list[StepTimes]:
    """Each trainer step of the ledger as `StepTimes`, oldest first (`telemetry/steps.step_splits`
    gives the parts; the generation seconds are split into model and each tool as the step's
    rollouts spent them)."""
    times = env_times(spans)
    own: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    queues: dict[int, list[float]] = defaultdict(list)
    phases: dict[int, list[LedgerSpan]] = defaultdict(list)
    collecting: dict[int, list[LedgerSpan]] = defaultdict(list)
    per_rollout: dict[int, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    for span in spans:
        extra = span.model_extra or {}
        key = tuple(extra.get(k) for k in ("env", "task", "seed", "rollout"))
        if span.name in PHASE_ROLE and "env" in extra:
            phases[span.step].append(span)
        if span.process == "orchestrator" and span.name == "wait_rollouts":
            collecting[span.step].append(span)
        if span.process == "orchestrator" or span.name == "reload_weights":
            own[span.step][span.name] += span.duration
        elif span.name == "env_queue":
            queues[span.step].append(span.duration)
        elif span.name in ("setup", "scoring") and "env" in extra:
            per_rollout[span.step][key] += span.duration
        elif span.name == "rollout":
            per_rollout[span.step][key] += sum((extra.get("tools") or {}).values())
    out = []
    for split in step_splits(spans):
        roles = dict.fromkeys(ROLES, 0.0)
        for part, seconds in split.parts.items():
            roles[ROLE_OF_PART[part]] += seconds
        per_env = {env: parts for env, parts in times.get(split.step, {}).items() if env != TRAINING}
        tool_s: dict[str, float] = defaultdict(float)
        for parts in per_env.values():
            for name, seconds in parts.items():
                if name.startswith("tool "):
                    tool_s[name.removeprefix("tool ")] += seconds
        generated = sum(parts.get("model", 0.0) for parts in per_env.values()) + sum(tool_s.values())
        tools = {}
        o = own.get(split.step, {})
        nearby = [s for k in range(split.step, split.step + STAGE_STEPS) for s in phases.get(k, [])]
        stage = _stage(collecting.get(split.step, []), nearby)
        stage["orchestrator"] += o.get("batching", 0.0)
        if generated > 0:
            for part in (roles, stage):
                moved = part["generation"] * sum(tool_s.values()) / generated
                part["env tools"] += moved
                part["generation"] -= moved
            total_tools = sum(tool_s.values())
            tools = {name: roles["env tools"] * s / total_tools for name, s in tool_s.items()} if total_tools else {}
        env_work = {env: sum(s for k, s in parts.items() if k != "model") for env, parts in per_env.items()}
        least = min(per_rollout.get(split.step, {}).values(), default=math.nan)
        queue = queues.get(split.step, [])
        out.append(
            StepTimes(
                step=split.step,
                wall=split.wall,
                roles=roles,
                trainer_busy=sum(split.parts[p] for p in TRAINER_OWN),
                rollouts_busy=o.get("wait_rollouts", 0.0) + o.get("batching", 0.0),
                policy_wait=o.get("wait_policy", 0.0) + o.get("reload_weights", 0.0),
                reload=o.get("reload_weights", 0.0),
                stage=stage,
                tools=tools,
                env_work=env_work,
                queue_s=sum(queue) / len(queue) if queue else math.nan,
                rollout_env_s=least,
            )
        )
    return out


PHASE_ROLE = {"generation": "generation", "scoring": "env scoring", "setup": "env setup", "env_queue": "env queue"}
"""A rollout's phase spans as roles, first match wins where several overlap (`telemetry/steps.ROLLOUT_ORDER`)."""
STAGE_STEPS = 4
"""The rollouts a batch's collection can be waiting on are those of it and of the next few batches
(in flight under the async bound)."""


def _stage(intervals: list[LedgerSpan], phases: list[LedgerSpan]) -> dict[str, float]:
    """Each instant of `intervals` (the orchestrator collecting rollouts) given to the first role of
    `PHASE_ROLE` whose phase is active then, else to `orchestrator`."""
    out = dict.fromkeys(ROLES, 0.0)
    for interval in intervals:
        inside = [s for s in phases if s.end > interval.start and s.start < interval.end]
        cuts = sorted(
            {
                interval.start,
                interval.end,
                *(t for s in inside for t in (s.start, s.end) if interval.start < t < interval.end),
            }
        )
        for a, b in zip(cuts, cuts[1:], strict=False):
            t = (a + b) / 2
            active = {s.name for s in inside if s.start <= t < s.end}
            name = next((n for n in PHASE_ROLE if n in active), None)
            out[PHASE_ROLE[name] if name else "orchestrator"] += b - a
    return out


def metrics_step(step: int, trainer: dict[str, Any], orchestrator: dict[str, Any], wall: float) -> StepTimes:
    """Step `step` from its trainer and orchestrator metrics lines alone (the live console has no
    ledger): the trainer's train and publish seconds, and its wait for the batch split over the
    roles in proportion to the batch's rollout-seconds per part (`perf/rollout_s/...`)."""
    wait, train, publish = (
        _seconds(trainer, key) for key in ("trainer/wait_time_s", "trainer/step_time_s", "trainer/publish_time_s")
    )
    if not wall > 0:
        wall = wait + train + publish
    roles = dict.fromkeys(ROLES, 0.0)
    roles["training"], roles["hand-off"] = train, publish
    roles["other"] = max(wall - wait - train - publish, 0.0)
    parts = {
        k.removeprefix(ROLLOUT_SECONDS): _seconds(orchestrator, k)
        for k in orchestrator
        if k.startswith(ROLLOUT_SECONDS)
    }
    total = sum(parts.values())
    tools = {}
    for part, seconds in parts.items():
        share = wait * seconds / total if total > 0 else 0.0
        if part.startswith("tool "):
            tools[part.removeprefix("tool ")] = share
        roles[ROLE_OF_ROLLOUT_PART.get(part, "env tools")] += share
    if total <= 0:
        roles["orchestrator"] += wait
    scale = wall / sum(roles.values()) if sum(roles.values()) > 0 else 1.0  # the wait can exceed a short wall
    policy_wait = _seconds(orchestrator, "perf/wait_for_trainer")
    return StepTimes(
        step=step,
        wall=wall,
        roles={role: seconds * scale for role, seconds in roles.items()},
        trainer_busy=train + publish,
        rollouts_busy=max(_seconds(orchestrator, "perf/step_time") - policy_wait, 0.0),
        policy_wait=policy_wait,
        tools=tools,
    )


def _seconds(record: dict[str, Any], key: str) -> float:
    value = metric_float(record.get(key))
    return value if math.isfinite(value) and value > 0 else 0.0


def bound(times: StepTimes) -> tuple[str, float] | None:
    """The role holding at least `DOMINANT` of the step's wall time, with its share (None: none does)."""
    if times.wall <= 0:
        return None
    role, seconds = max(((r, s) for r, s in times.roles.items() if r != "other"), key=lambda rs: rs[1])
    share = seconds / times.wall
    return (role, share) if share >= DOMINANT else None


def step_note(times: StepTimes) -> str:
    """`bound: env scoring 71%` for the step line when one role dominates, else ''."""
    found = bound(times)
    return f"bound: {found[0]} {found[1]:.0%}" if found else ""
