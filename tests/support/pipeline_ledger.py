"""Time ledgers of simulated pipelines whose bound is known by construction, for the diagnosis's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envrl.data.layout import ledger_file
from envrl.telemetry.ledger import LedgerSpan

ENV = "slow"


def span(process: str, name: str, step: int, start: float, end: float, **extra: Any) -> LedgerSpan:
    return LedgerSpan(process=process, name=name, step=step, start=start, end=end, run=0.0, **extra)


def simulate(
    steps: int,
    level: int,
    *,
    gen: float,
    score: float,
    train: float,
    rollouts: int = 4,
    one_scorer: bool = False,
    tool: float = 0.0,
) -> list[LedgerSpan]:
    """Ledger spans of a run whose orchestrator makes batch n once policy n - level - 1 is out
    (reload 0.05 s), each rollout generating `gen` s (`tool` of it in one tool) then scored in
    `score` s (`one_scorer`: one call at a time, so rollout i's scoring waits for the i before
    it), and whose trainer trains `train` s once the batch is published."""
    out: list[LedgerSpan] = []
    published: dict[int, float] = {}
    orchestrator = trainer = 0.0
    for n in range(steps):
        ready = orchestrator
        need = n - level - 1
        if need >= 0 and published[need] > ready:
            out.append(span("orchestrator", "wait_policy", n, ready, published[need]))
            out.append(span("inference", "reload_weights", n, published[need], published[need] + 0.05))
            ready = published[need] + 0.05
        end = ready
        for i in range(rollouts):
            ids = {"env": ENV, "rollout": i, "task": n, "seed": 0}
            generated = ready + gen
            scored = generated + (score * (i + 1) if one_scorer else score)
            tools = {"tools": {"lookup": tool}} if tool else {}
            out.append(span(f"env {ENV}", "env_queue", n, ready, ready, **ids))
            out.append(span("inference", "generation", n, ready, generated, **ids))
            out.append(span(f"env {ENV}", "scoring", n, generated, scored, **ids))
            out.append(span(f"env {ENV}", "rollout", n, ready, scored, **ids, **tools))
            end = max(end, scored)
        out.append(span("orchestrator", "wait_rollouts", n, ready, end))
        out.append(span("orchestrator", "batching", n, end, end + 0.02))
        orchestrator = end + 0.02
        start = max(trainer, orchestrator)
        out.append(span("trainer", "wait_batch", n, trainer, start))
        out.append(span("trainer", "read_batch", n, start, start + 0.01))
        out.append(span("trainer", "compute", n, start + 0.01, start + 0.01 + train))
        done = start + 0.01 + train
        out.append(span("trainer", "publish", n, done, done + 0.02))
        published[n] = done + 0.02
        out.append(span("trainer", "log", n, done + 0.02, done + 0.03))
        trainer = done + 0.03
    return sorted(out, key=lambda s: s.start)


def write_ledger(output_dir: Path, spans: list[LedgerSpan]) -> None:
    """`spans` as the run's ledger files, one per writer process as a run writes them."""
    for span in spans:
        writer = span.process if span.process in ("orchestrator", "trainer") else "orchestrator"
        path = ledger_file(output_dir, writer)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(span.model_dump()) + "\n")
