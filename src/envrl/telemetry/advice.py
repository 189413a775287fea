"""What a run waits for over its last steps and over the run, and the settings that would move it, each with the
speed-up the pipeline model expects from the run's own numbers (docs/report.md); `diagnose_run` never raises, and
advice is given only where its expected speed-up is at least `ADVISE_MIN`."""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel

from envrl.data.layout import ledger_dir, process_config_file
from envrl.telemetry.diagnosis import ENV_ROLES, ROLES, StepTimes, ledger_steps
from envrl.telemetry.ledger import read_ledger
from envrl.telemetry.metrics import Record, metric_float, read_metrics

WINDOW = 10
"""The recent steps the first diagnosis covers."""
ADVISE_MIN = 1.3
"""A setting is advised only when the model expects at least this factor more steps per minute (below
it, run-to-run noise on a shared box is as large as the gain)."""
MANY_MICRO_BATCHES = 4
"""A step of at least this many micro-batches may be advised fewer, fuller ones."""
WORKER_FACTOR = 4
"""Advised env workers: this many times the pool's current `max_workers`."""


class Advice(BaseModel):
    setting: str
    """The config key, as a user writes it."""
    change: str
    """`1 -> 4`, or what to do where no value can be chosen (a slow tool)."""
    speedup: float
    """Expected factor on steps per minute."""
    reason: str


class Diagnosis(BaseModel):
    window: str
    """`last 10 steps` or `run`."""
    first_step: int
    last_step: int
    step_s: float
    """Mean wall time of a step."""
    shares: dict[str, float]
    """Each role's share of the step's wall time (`ROLES`); they sum to 1."""
    bound: str
    bound_share: float
    trainer_busy: float
    """Share of the wall the trainer works; the rest it waits for batches."""
    rollouts_busy: float
    """Share of the wall the orchestrator spends making batches (collecting rollouts, batching)."""
    policy_wait: float
    """Share of the wall the orchestrator waits for the trainer's policy (the async bound) and its reload."""
    queue_s: float | None
    """Mean seconds a rollout waited from dispatch to its env worker's start."""
    tools: dict[str, float]
    """Share of the wall per tool, slowest first."""
    lag: float | None
    """Mean policy lag of the trained samples (steps)."""
    max_async_level: int | None
    advice: list[Advice]

    def line(self) -> str:
        """One line: the bound and the numbers that show it."""
        lag = f"lag {self.lag:.2f} of max_async_level {self.max_async_level}" if self.lag is not None else ""
        queue = f"queued {self.queue_s:.2f} s/rollout for an env worker" if self.queue_s is not None else ""
        facts = [
            f"trainer busy {self.trainer_busy:.0%} (waits {1 - self.trainer_busy:.0%} for batches)",
            f"rollouts busy {self.rollouts_busy:.0%}",
            f"orchestrator waits {self.policy_wait:.0%} for the policy",
            *(part for part in (queue, lag) if part),
        ]
        return (
            f"{self.window} (steps {self.first_step}..{self.last_step}, {self.step_s:.2f} s/step): bound by "
            f"{self.bound} {self.bound_share:.0%}; {', '.join(facts)}"
        )

    def lines(self) -> list[str]:
        """The line, each role's share, then each advice (or that none is due)."""
        shares = ", ".join(
            f"{role} {s:.0%}" for role, s in sorted(self.shares.items(), key=lambda rs: -rs[1]) if s >= 0.01
        )
        out = [self.line(), f"  shares: {shares}"]
        if self.tools:
            out.append("  tools: " + ", ".join(f"{name} {s:.0%}" for name, s in self.tools.items()))
        out += [
            f"  advice: {a.setting}: {a.change} (expected {a.speedup:.2f}x steps/min): {a.reason}" for a in self.advice
        ]
        if not self.advice:
            out.append(f"  advice: none (no setting is expected to give {ADVISE_MIN:g}x or more)")
        return out


@dataclass
class RunFacts:
    """What the advice needs besides the step times: the run's settings and the trainer's numbers."""

    max_async_level: int | None = None
    pools: dict[str, int] = field(default_factory=dict)
    """Each train env's `pool.max_workers` (absent: unknown)."""
    replicas: int = 1
    micro_batch_tokens: int | None = None
    trainer: dict[int, Record] = field(default_factory=dict)
    """The trainer's metrics line of each step."""


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_facts(output_dir: Path, records: list[Record]) -> RunFacts:
    """The settings of the run in `output_dir` (its resolved configs) and its trainer's metrics lines."""
    orchestrator = _toml(process_config_file(output_dir, "orchestrator"))
    trainer = _toml(process_config_file(output_dir, "trainer"))
    pools = {}
    for env in orchestrator.get("envs", []):
        if isinstance(env, dict) and env.get("train", True) and isinstance(env.get("pool"), dict):
            workers = env["pool"].get("max_workers")
            if isinstance(workers, int):
                pools[str(env.get("name") or env.get("id"))] = workers
    urls = orchestrator.get("inference", {}).get("base_url", "")
    replicas = len(urls) if isinstance(urls, list) else len([u for u in str(urls).split(",") if u.strip()])
    level = orchestrator.get("max_async_level", trainer.get("max_async_level"))
    tokens = trainer.get("micro_batch_tokens")
    return RunFacts(
        max_async_level=level if isinstance(level, int) else None,
        pools=pools,
        replicas=max(replicas, 1),
        micro_batch_tokens=tokens if isinstance(tokens, int) else None,
        trainer={r["step"]: r for r in records if r.get("process") == "trainer"},
    )


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def diagnose(steps: list[StepTimes], facts: RunFacts, window: str) -> Diagnosis:
    """The diagnosis of `steps` (not empty) and the advice for them."""
    wall = _mean([s.wall for s in steps])
    total = sum(s.wall for s in steps) or 1.0
    shares = {role: sum(s.roles[role] for s in steps) / total for role in ROLES}
    role, share = max(((r, v) for r, v in shares.items() if r != "other"), key=lambda rv: rv[1])
    tools: dict[str, float] = {}
    for s in steps:
        for name, seconds in s.tools.items():
            tools[name] = tools.get(name, 0.0) + seconds / total
    lags = [metric_float(facts.trainer.get(s.step, {}).get("trainer/staleness_mean")) for s in steps]
    lag, queue = _mean(lags), _mean([s.queue_s for s in steps])
    d = Diagnosis(
        window=window,
        first_step=steps[0].step,
        last_step=steps[-1].step,
        step_s=wall,
        shares=shares,
        bound=role,
        bound_share=share,
        trainer_busy=min(sum(s.trainer_busy for s in steps) / total, 1.0),
        rollouts_busy=min(sum(s.rollouts_busy for s in steps) / total, 1.0),
        policy_wait=min(sum(s.policy_wait for s in steps) / total, 1.0),
        queue_s=queue if math.isfinite(queue) else None,
        tools=dict(sorted(tools.items(), key=lambda kv: -kv[1])),
        lag=lag if math.isfinite(lag) else None,
        max_async_level=facts.max_async_level,
        advice=[],
    )
    d.advice = [a for a in advise(d, steps, facts) if a.speedup >= ADVISE_MIN]
    return d


def diagnose_run(output_dir: Path, window: int = WINDOW) -> list[Diagnosis]:
    """The run's diagnosis over its last `window` steps and over the whole run (one when they are
    the same steps); the first step, which carries the processes' start-up, is left out once there
    are three. Empty before the trainer finished a step, and (logged) when the files cannot be
    read: a summary, a report or a stall dump is never lost to its diagnosis."""
    try:
        return _diagnose_run(output_dir, window)
    except Exception as e:  # noqa: BLE001 - see the docstring
        logger.opt(exception=e).warning(f"the diagnosis of {output_dir} failed: {e}")
        return []


def _diagnose_run(output_dir: Path, window: int) -> list[Diagnosis]:
    if not ledger_dir(output_dir).is_dir():
        return []
    steps = [s for s in ledger_steps(read_ledger(output_dir)) if s.wall > 0]
    if len(steps) >= 3:
        steps = steps[1:]
    if not steps:
        return []
    facts = run_facts(output_dir, read_metrics(output_dir))
    recent = steps[-window:]
    out = [diagnose(recent, facts, f"last {len(recent)} steps")]
    if len(recent) < len(steps):
        out.append(diagnose(steps, facts, "run"))
    return out


def _pipeline(trainer: float, rollouts: float, level: int | None) -> float:
    """A step's seconds in the pipeline model: the two stages in turn (`max_async_level` 0), else overlapped."""
    return trainer + rollouts if level == 0 else max(trainer, rollouts)


def advise(d: Diagnosis, steps: list[StepTimes], facts: RunFacts) -> list[Advice]:
    """Every setting the model expects to move the step rate, best first."""
    level = facts.max_async_level
    t, r = _mean([s.trainer_busy for s in steps]), _mean([s.rollouts_busy + s.reload for s in steps])
    if not (t > 0 and r > 0):
        return []
    now = _pipeline(t, r, level)
    out = []

    def speedup(trainer: float, rollouts: float, new_level: int | None = level) -> float:
        return now / max(_pipeline(trainer, rollouts, new_level), 1e-9)

    if level == 0 or (
        level is not None
        and d.lag is not None
        and d.lag >= level - 0.25
        and d.policy_wait >= 0.2
        and d.trainer_busy <= 0.8
    ):
        new = (level or 0) + 1
        gain = (now if level == 0 else d.step_s) / max(t, r)
        out.append(
            Advice(
                setting="max_async_level",
                change=f"{level} -> {new}",
                speedup=gain,
                reason=(
                    f"the trainer ({t:.2f} s/step) and the rollouts ({r:.2f} s/step) take turns; with {new} the next "
                    f"batch is generated while the trainer trains, so a step takes the slower of the two. This changes "
                    f"the algorithm: a batch may come from a policy up to {new} step(s) old, corrected by the loss's "
                    "importance ratio (trainer.loss.clip or ratio_mask must be set)"
                ),
            )
        )
    stage = {role: _mean([s.stage.get(role, math.nan) for s in steps]) for role in ROLES}
    if not all(math.isfinite(v) for v in stage.values()):  # no ledger: the critical path's shares
        stage = {role: share * d.step_s for role, share in d.shares.items()}
    env_s, g = sum(stage[role] for role in ENV_ROLES), stage["generation"]
    rollout_side = level == 0 or r >= t
    if rollout_side and env_s >= g and max(d.shares[role] for role in ENV_ROLES) >= d.shares["training"]:
        out += _env_advice(d, steps, facts, env_s, t, r, speedup)
    elif rollout_side and d.shares["generation"] >= d.shares["training"]:
        k = facts.replicas
        out.append(
            Advice(
                setting="placement.inference.replicas",
                change=f"{k} -> {k + 1}",
                speedup=speedup(t, r - g / (k + 1)),
                reason=(
                    f"generation holds {d.shares['generation']:.0%} of the step; one more replica (or more GPUs for "
                    f"inference in `placement`) spreads it over {k + 1}. On GPUs the split that balances the stages "
                    f"gives trainer : inference about {t:.2f} : {r:.2f} of the devices"
                ),
            )
        )
    if (level == 0 or t > r) and d.shares["training"] >= d.shares["generation"]:
        out += _trainer_advice(steps, facts, t, r, speedup)
    return sorted(out, key=lambda a: -a.speedup)


def _env_advice(
    d: Diagnosis, steps: list[StepTimes], facts: RunFacts, env_s: float, t: float, r: float, speedup: Any
) -> list[Advice]:
    """More env workers when env work queues (`env_s`, the rollout stage's env seconds, exceed the
    quickest rollout's own), and the slowest tool by name."""
    out = []
    per_rollout = _mean([s.rollout_env_s for s in steps])  # the least a rollout's env work takes
    work: dict[str, float] = {}
    for s in steps:
        for env, seconds in s.env_work.items():
            work[env] = work.get(env, 0.0) + seconds
    env = max(work, key=lambda e: work[e]) if work else next(iter(facts.pools), None)
    workers = facts.pools.get(env) if env else None
    if env and workers and math.isfinite(per_rollout) and env_s > 1.5 * per_rollout:
        new = workers * WORKER_FACTOR
        floor = per_rollout  # one rollout's own env work is not split across workers
        saved = env_s - max(env_s * workers / new, floor)
        out.append(
            Advice(
                setting=f"orchestrator.envs[{env}].pool",
                change=f"min_workers = max_workers = {new} (max_workers {workers} now)",
                speedup=speedup(t, r - saved),
                reason=(
                    f"env work holds {env_s / d.step_s:.0%} of the step ({env_s:.2f} s) while the quickest rollout's "
                    f"takes {per_rollout:.2f} s: rollouts wait for a worker (or its scorer, its children); {new} workers "
                    f"share it {new // workers}x wider (min_workers too: a pool grows only on in-flight rollouts)"
                ),
            )
        )
    if d.tools:
        name, share = next(iter(d.tools.items()))
        if share >= 0.25:
            out.append(
                Advice(
                    setting=f"tool {name}",
                    change="make it faster (cache, batch, a cheaper backend)",
                    speedup=speedup(t, r - share * d.step_s / 2),
                    reason=f"tool {name!r} holds {share:.0%} of the step; the expected effect is for halving its time",
                )
            )
    return out


def _trainer_advice(steps: list[StepTimes], facts: RunFacts, t: float, r: float, speedup: Any) -> list[Advice]:
    """Fewer, fuller micro-batches when a step runs many: the expected effect takes a micro-batch's
    cost as all fixed (its tokens free), and the other stage as it was."""
    rows = [facts.trainer[s.step] for s in steps if s.step in facts.trainer]
    points = [
        (metric_float(row.get("trainer/tokens")), metric_float(row.get("trainer/step_time_s")))
        for row in rows
        if metric_float(row.get("trainer/micro_batches")) >= MANY_MICRO_BATCHES
    ]
    points = [p for p in points if all(math.isfinite(v) for v in p)]
    budget = facts.micro_batch_tokens
    if not points or budget is None:
        return []
    m = statistics.fmean(metric_float(row.get("trainer/micro_batches")) for row in rows)
    tokens = max(p[0] for p in points)
    new_budget = 1 << math.ceil(math.log2(max(tokens, budget * MANY_MICRO_BATCHES)))
    new_m = max(1.0, math.ceil(tokens / new_budget))
    compute = statistics.fmean(p[1] for p in points)
    saved = compute * (1 - new_m / m)
    return [
        Advice(
            setting="trainer.micro_batch_tokens",
            change=f"{budget} -> {new_budget}",
            speedup=speedup(t - saved, r),
            reason=(
                f"training bounds the step: {compute:.2f} s of compute in {m:.0f} micro-batches of about "
                f"{tokens / m:.0f} tokens; {new_budget} tokens make {new_m:.0f}, and a small micro-batch costs "
                "mostly its fixed work (the expected effect saves all of it and leaves the rollouts as they were). "
                "It costs memory (activations and logits grow with it); it does not change what is learned"
            ),
        )
    ]
