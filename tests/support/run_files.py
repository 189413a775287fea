"""A run directory's files as tests and scripts read and write them.

Guarantee: `metric_lines` returns every `metrics.jsonl` record in order; `write_batches` publishes
the same synthetic batch for every step (tagged with that step's policy), so a trainer run on it is
reproducible from `seed`.
"""

from __future__ import annotations

import json
from pathlib import Path

from envrl.data.samples import write_batch
from tests.support.samples import synthetic_samples


def metric_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def write_batches(out: Path, steps: int, *, count: int = 6, seed: int = 0) -> None:
    for step in range(steps):
        write_batch(out, step, synthetic_samples(count, policy_step=step, seed=seed))
