"""What a run waits for, from ledgers of simulated pipelines whose bound is known by construction:
the bound, each role's share, and advice with the speed-up the pipeline model expects (or none)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from envrl.telemetry.advice import ADVISE_MIN, RunFacts, diagnose
from envrl.telemetry.diagnosis import ROLES, bound, ledger_steps, metrics_step, step_note
from envrl.telemetry.ledger import LedgerSpan
from tests.support.pipeline_ledger import ENV, simulate


def diagnosis(spans: list[LedgerSpan], facts: RunFacts) -> Any:
    steps = ledger_steps(spans)[1:]  # the first step carries the start
    return diagnose(steps, facts, "run")


def test_each_steps_roles_sum_to_its_wall_time() -> None:
    for times in ledger_steps(simulate(6, 1, gen=0.4, score=0.3, train=0.5, tool=0.1)):
        assert set(times.roles) == set(ROLES)
        # seconds on one clock, summed over at most a few dozen spans: float error is ~1e-15 s each
        assert math.isclose(sum(times.roles.values()), times.wall, abs_tol=1e-9)


def test_scoring_that_waits_for_one_scorer_is_the_bound_and_more_workers_are_advised() -> None:
    spans = simulate(8, 1, gen=0.2, score=0.25, train=0.3, rollouts=16, one_scorer=True)
    d = diagnosis(spans, RunFacts(max_async_level=1, pools={ENV: 1}))
    assert d.bound == "env scoring" and d.bound_share > 0.7
    assert d.trainer_busy < 0.2, "the trainer mostly waits for batches"
    [workers] = [a for a in d.advice if a.setting == f"orchestrator.envs[{ENV}].pool"]
    assert "max_workers = 4" in workers.change
    # the model: scoring (16 x 0.25 s = 4 s a step) spread over 4 workers but never below the quickest
    # rollout's 0.25 s: the rollout stage (0.2 s generation, 4 s scoring, 0.02 s batching) becomes 1.22 s, still
    # slower than training (0.36 s)
    assert workers.speedup == pytest.approx(4.22 / 1.22, rel=1e-6)
    assert bound(ledger_steps(spans)[-1]) == ("env scoring", pytest.approx(d.bound_share, abs=0.05))


def test_generation_and_training_taking_turns_are_advised_max_async_level_with_what_it_changes() -> None:
    d = diagnosis(simulate(8, 0, gen=0.5, score=0.05, train=0.5), RunFacts(max_async_level=0, pools={ENV: 1}))
    [advice] = d.advice
    assert advice.setting == "max_async_level" and advice.change == "0 -> 1"
    assert "changes the algorithm" in advice.reason and "importance ratio" in advice.reason
    # trainer 0.54 s (read, train, publish, log) and rollouts 0.62 s (reload, generate, score, batch) in
    # turn become the slower of the two a step
    assert advice.speedup == pytest.approx((0.54 + 0.62) / 0.62, rel=1e-6)
    assert d.policy_wait > 0.3, "the orchestrator waits for each policy"


def trainer_lines(steps: int, micro_batches: int) -> dict[int, dict[str, float]]:
    """Trainer metrics lines whose step time is 0.05 s per micro-batch plus 1 ms per token."""
    lines = {}
    for n in range(steps):
        tokens = 1000 + 37 * n
        lines[n] = {
            "trainer/tokens": tokens,
            "trainer/micro_batches": micro_batches,
            "trainer/step_time_s": 0.05 * micro_batches + 0.001 * tokens,
        }
    return lines


def test_a_trainer_bound_run_names_training_and_fewer_micro_batches() -> None:
    facts = RunFacts(max_async_level=1, pools={ENV: 1}, micro_batch_tokens=1, trainer=trainer_lines(8, 32))
    d = diagnosis(simulate(8, 1, gen=0.3, score=0.05, train=2.7), facts)
    assert d.bound == "training" and d.bound_share > 0.8
    [advice] = d.advice
    assert advice.setting == "trainer.micro_batch_tokens" and advice.change.startswith("1 -> ")
    assert advice.speedup > ADVISE_MIN
    assert "does not change what is learned" in advice.reason


def test_a_balanced_run_gets_no_advice() -> None:
    d = diagnosis(simulate(8, 1, gen=0.45, score=0.05, train=0.5), RunFacts(max_async_level=1, pools={ENV: 8}))
    assert d.advice == []
    assert d.trainer_busy > 0.8 and d.rollouts_busy > 0.8


def test_a_slow_tool_is_named() -> None:
    d = diagnosis(simulate(8, 1, gen=1.0, score=0.05, train=0.3, tool=0.9), RunFacts(max_async_level=1, pools={}))
    assert d.bound == "env tools"
    assert next(iter(d.tools)) == "lookup"
    assert any(a.setting == "tool lookup" for a in d.advice)


def test_the_live_step_line_names_a_dominant_role_from_the_metrics_lines_alone() -> None:
    trainer = {"trainer/wait_time_s": 3.0, "trainer/step_time_s": 0.8, "trainer/publish_time_s": 0.2}
    orchestrator = {
        "perf/rollout_s/model": 4.0,
        "perf/rollout_s/scoring": 12.0,
        "perf/step_time": 4.0,
        "perf/wait_for_trainer": 0.0,
    }
    times = metrics_step(3, trainer, orchestrator, 4.0)
    assert math.isclose(sum(times.roles.values()), 4.0)
    assert step_note(times) == "bound: env scoring 56%"  # 3 s of waiting x 12/16, of 4 s
    assert step_note(metrics_step(3, {**trainer, "trainer/wait_time_s": 1.0}, orchestrator, 2.0)) == ""
