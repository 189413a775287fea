"""`WorkerPool` decisions on real pools, no processes: who gets a request, how load is counted,
when the pool grows, shrinks, replaces the dead or gives up."""

from __future__ import annotations

import math
import signal

from envrl.serve.config import PoolConfig
from envrl.serve.pool import MAX_STARTUP_FAILURES, WorkerHandle, WorkerPool


def ready_pool(config: PoolConfig, now: float = 0.0) -> WorkerPool:
    """A pool scaled once for no demand, every worker it started ready."""
    pool = WorkerPool(config)
    for worker in pool.scale(0, now).started:
        pool.mark_ready(worker)
    return pool


def load(pool: WorkerPool, requests: int) -> list[WorkerHandle]:
    """Assign `requests` tokens the way the server does (pick, then assign); the picked workers."""
    picked = []
    for token in range(requests):
        worker = pool.pick()
        assert worker is not None, f"no free worker for request {token}"
        pool.assign(worker, token)
        picked.append(worker)
    return picked


def elastic(**fields: float) -> PoolConfig:
    return PoolConfig.model_validate({"min_workers": 1, "max_workers": 4, "multiplex": 4, **fields})


def test_a_fixed_pool_starts_its_workers_and_never_grows_or_shrinks() -> None:
    pool = WorkerPool(PoolConfig(min_workers=3, max_workers=3, multiplex=2, idle_timeout_s=1.0))
    assert [w.id for w in pool.scale(0, 0.0).started] == [0, 1, 2] and pool.grow_above == math.inf
    for worker in pool.workers.values():
        pool.mark_ready(worker)
        worker.idle_since = 0.0
    assert pool.scale(1000, 0.0).started == [] and pool.grow_above == math.inf
    assert pool.scale(0, 100.0).retired == [] and len(pool.live) == 3  # idle past idle_timeout_s: kept
    assert pool.capacity == 6


def test_pick_chooses_the_least_loaded_ready_worker_and_none_when_all_slots_are_full() -> None:
    pool = ready_pool(PoolConfig(min_workers=2, max_workers=2, multiplex=2))
    picked = load(pool, 4)
    assert sorted(w.id for w in picked[:2]) == [0, 1]  # spread before doubling up
    assert pool.pick() is None and pool.in_flight == 4


def test_pick_skips_workers_that_are_starting_or_retiring() -> None:
    pool = WorkerPool(PoolConfig(min_workers=2, max_workers=2, multiplex=2))
    first, second = pool.scale(0, 0.0).started
    assert pool.pick() is None  # none ready yet
    pool.mark_ready(second)
    assert pool.pick() is second
    second.retiring = True
    assert pool.pick() is None


def test_release_frees_a_slot_and_ignores_unknown_workers_and_tokens() -> None:
    pool = ready_pool(PoolConfig(min_workers=1, max_workers=1, multiplex=1))
    (worker,) = load(pool, 1)
    pool.release(None, 0)  # a request answered while queued
    pool.release(99, 0)  # its worker already gone
    assert pool.pick() is None
    pool.release(worker.id, 0)
    pool.release(worker.id, 0)  # twice is harmless
    assert pool.pick() is worker and pool.in_flight == 0


def test_an_elastic_pool_grows_once_demand_passes_grow_at_of_live_capacity() -> None:
    pool = ready_pool(elastic(grow_at=0.5))  # 1 worker x 4 slots; grows past 2 requests per worker
    assert len(pool.workers) == 1 and pool.grow_above == 2
    assert pool.scale(2, 0.0).started == []
    assert len(pool.scale(3, 0.0).started) == 1 and pool.grow_above == 4
    assert len(pool.scale(7, 0.0).started) == 2  # ceil(7 / 2) = 4 workers in all
    assert pool.scale(1000, 0.0).started == [] and len(pool.workers) == 4 and pool.grow_above == math.inf


def test_idle_workers_above_min_retire_only_after_idle_timeout_and_never_busy_ones() -> None:
    pool = WorkerPool(elastic(idle_timeout_s=10.0, grow_at=1.0))
    for worker in pool.scale(12, 0.0).started:  # 3 workers
        pool.mark_ready(worker)
    busy = pool.workers[0]
    pool.assign(busy, 7)
    for worker in pool.workers.values():
        worker.idle_since = 0.0
    assert pool.scale(0, 5.0).retired == []  # idle, but not for long enough
    retired = pool.scale(0, 11.0).retired
    assert sorted(w.id for w in retired) == [1, 2] and all(w.retiring for w in retired)
    assert pool.live == [busy]  # min_workers = 1 kept; the busy one is never retired
    assert pool.scale(0, 100.0).retired == []


def test_retiring_keeps_min_workers_even_when_all_are_idle() -> None:
    pool = WorkerPool(elastic(min_workers=2, idle_timeout_s=1.0, grow_at=1.0))
    for worker in pool.scale(16, 0.0).started:
        pool.mark_ready(worker)
    for worker in pool.workers.values():
        worker.idle_since = 0.0
    assert len(pool.scale(0, 50.0).retired) == 2 and len(pool.live) == 2


def test_a_dead_worker_is_replaced_at_the_next_scale() -> None:
    pool = ready_pool(PoolConfig(min_workers=2, max_workers=2, multiplex=1))
    dead = pool.remove(0, -signal.SIGKILL)
    assert dead.id == 0 and list(pool.workers) == [1]
    assert [w.id for w in pool.scale(0, 0.0).started] == [2]  # ids are never reused
    assert pool.startup_failures == 0  # it had been ready


def test_a_retired_worker_leaving_is_not_a_failure_and_is_not_replaced_beyond_min() -> None:
    pool = WorkerPool(elastic(idle_timeout_s=1.0, grow_at=1.0))
    for worker in pool.scale(8, 0.0).started:
        pool.mark_ready(worker)
        worker.idle_since = 0.0
    (retired,) = pool.scale(0, 5.0).retired
    pool.remove(retired.id, 0)
    assert pool.scale(0, 5.0).started == [] and pool.startup_failures == 0


def test_start_up_failures_in_a_row_break_the_pool_and_a_ready_worker_resets_the_count() -> None:
    pool = WorkerPool(PoolConfig(min_workers=1, max_workers=1))
    for _ in range(MAX_STARTUP_FAILURES - 1):
        (worker,) = pool.scale(0, 0.0).started
        pool.remove(worker.id, 1)
    (worker,) = pool.scale(0, 0.0).started
    pool.mark_ready(worker)
    assert pool.startup_failures == 0
    pool.remove(worker.id, -signal.SIGSEGV)  # a crash after ready: not a start-up failure
    for _ in range(MAX_STARTUP_FAILURES):
        assert not pool.broken
        (worker,) = pool.scale(0, 0.0).started
        pool.remove(worker.id, -signal.SIGSEGV)
    assert pool.broken and pool.scale(0, 0.0).started == []
    assert f"{MAX_STARTUP_FAILURES} env workers in a row failed" in pool.broken_message("some-env", None)


def test_kills_from_outside_before_ready_do_not_count_as_start_up_failures() -> None:
    pool = WorkerPool(PoolConfig(min_workers=1, max_workers=1))
    for code in [-signal.SIGKILL, -signal.SIGTERM] * MAX_STARTUP_FAILURES:
        (worker,) = pool.scale(0, 0.0).started
        pool.remove(worker.id, code)
    assert pool.startup_failures == 0 and not pool.broken
