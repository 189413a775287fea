"""The scheduler on its own: what it dispatches (bound, staleness, seeds, requeued groups first),
what a batch holds, and what it drops as stale, against an env that answers in-process."""

import asyncio
from collections import Counter

from envrl.data.seeds import rollout_seed
from envrl.data.traces import Trace
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.orchestrator.scheduler import BatchShape, Group, Scheduler
from envrl.orchestrator.state import PendingGroup
from tests.support.scripted_envs import AnsweringEnv, InfraFailingEnv, LabelledEnv


def scheduler(env: EnvHandle, *, max_inflight: int = 64, max_steps: int = 10, seed: int = 0, **fields) -> Scheduler:
    shape = BatchShape(group_size=2, batch_size=4, max_inflight=max_inflight, max_async_level=1, max_steps=max_steps)
    return Scheduler(TrainEnvs([env], seed=seed), shape, seed=seed, counters=Counter(), **fields)


def dispatched_groups(s: Scheduler, step: int, policy: int) -> int:
    async def scenario() -> int:
        s.dispatch(step, policy)
        count = len(s.inflight_groups())
        await asyncio.sleep(0)  # the calls start
        await s.close()
        return count

    return asyncio.run(scenario())


def test_dispatch_stops_at_groups_that_would_be_stale_on_arrival() -> None:
    # Two groups per step: policy p may generate for steps up to p + 1 (max_async_level 1).
    assert dispatched_groups(scheduler(AnsweringEnv()), step=0, policy=0) == 4
    assert dispatched_groups(scheduler(AnsweringEnv()), step=0, policy=1) == 6
    assert dispatched_groups(scheduler(AnsweringEnv(), max_steps=1), step=0, policy=0) == 2, (
        "no group past the last step"
    )


def test_rollouts_in_flight_stay_within_max_inflight() -> None:
    s = scheduler(AnsweringEnv(), max_inflight=5)
    assert dispatched_groups(s, step=0, policy=0) == 2
    assert s.counters["dispatched_rollouts"] == 4


def test_new_groups_take_consecutive_seed_ranges_of_the_run_seed() -> None:
    env = AnsweringEnv()
    s = scheduler(env, seed=7)
    dispatched_groups(s, step=0, policy=0)
    assert [seed for _, seed in env.calls] == [rollout_seed(7, 2 * k) for k in range(4)]
    assert s.dispatched == 4


def test_a_batch_holds_whole_groups_and_the_extra_finished_ones_stay_pending() -> None:
    env = AnsweringEnv()
    s = scheduler(env)

    async def scenario() -> tuple[list[list[Trace]], list[PendingGroup]]:
        batch = await s.collect(step=0, policy=0)
        pending = s.pending()
        await s.close()
        return [g.traces for g in batch], pending

    batch, pending = asyncio.run(scenario())
    assert [len(traces) for traces in batch] == [2, 2] and not any(t.has_error for g in batch for t in g)
    batched = {traces[0].task.idx for traces in batch}
    assert sorted([*batched, *(p.task_idx for p in pending)]) == sorted(task for task, _ in env.calls)


def test_stale_groups_are_cancelled_or_dropped_and_marked_stale() -> None:
    env = AnsweringEnv(hang=frozenset({3}))
    s = scheduler(env)

    async def scenario() -> tuple[list[int], list[int], list[PendingGroup]]:
        await s.collect(step=0, policy=0)  # 4 groups of policy 0: 2 batched, 1 finished left, 1 hanging
        kept = s.drop_stale(step=1)  # step 1 may train on policy 0
        hanging = s.inflight_groups()[0]
        stale = s.drop_stale(step=2)  # step 2 may not
        await asyncio.sleep(0)
        assert any(g is hanging for g in stale) and env.cancelled == [3], "the hanging call was cancelled"
        errors = [t.error.type for g in stale for t in g.traces if t.error is not None]
        return [len(kept)], errors, s.pending()

    kept, errors, pending = asyncio.run(scenario())
    assert kept == [0]
    assert errors == ["stale"] * 4, "both groups, every rollout: the finished one and the cancelled one"
    assert pending == [] and s.counters["stale_groups"] == 2


def test_requeued_groups_are_dispatched_first_with_their_seed_and_stay_pending_until_then() -> None:
    env = AnsweringEnv(hang=frozenset({0, 1}))
    requeued = [PendingGroup(env="x", task_idx=t, seed=100 + t) for t in (3, 5, 7)]
    s = scheduler(env, max_inflight=4, requeued=requeued)

    async def scenario() -> list[PendingGroup]:
        s.dispatch(step=0, policy=0)  # room for two groups: two of the three requeued ones
        pending = s.pending()
        await asyncio.sleep(0)  # the calls start
        await s.close()
        return pending

    pending = asyncio.run(scenario())
    assert env.calls == [(3, 103), (5, 105)]
    assert [(g.task_idx, g.seed) for g in pending] == [(3, 103), (5, 105), (7, 107)]
    assert s.counters == {"dispatched_rollouts": 4, "requeued_rollouts": 4} and s.dispatched == 0


def test_with_partial_rollouts_staleness_counts_the_oldest_token_of_a_group() -> None:
    # dispatched under policy 0; step 2 needs policy >= 1 (max_async_level 1)
    env = LabelledEnv(
        [
            [[1, 1], [1, 2]],  # every token from policy >= 1: kept, though dispatched under 0
            [[None, 2], [2]],  # an unlabelled token counts as the dispatch policy 0: stale
            [[1], [0, 1]],  # one rollout spans the 0 -> 1 reload: its oldest token (0) is stale
            [[2], [2]],
        ]
    )
    s = scheduler(env, partial_rollouts=True)

    async def scenario() -> tuple[list[list[int]], list[int], list[int]]:
        s.dispatch(step=0, policy=0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # every call answered
        batch = await s.collect(step=2, policy=2)
        stale = s.drop_stale(step=2)
        await s.close()
        return (
            [[g.task_idx, g.counted_step] for g in batch],
            [g.counted_step for g in stale],
            [g.task_idx for g in stale],
        )

    batch, stale_counted, stale_tasks = asyncio.run(scenario())
    tasks = [task for task, _ in env.calls]
    assert sorted(batch) == sorted([[tasks[0], 1], [tasks[3], 2]])
    assert sorted(stale_counted) == [0, 0] and sorted(stale_tasks) == sorted([tasks[1], tasks[2]])


def test_without_partial_rollouts_staleness_counts_the_dispatch_policy() -> None:
    env = LabelledEnv([[[1, 1], [1, 2]]] * 4)
    s = scheduler(env)

    async def scenario() -> list[Group]:
        await s.collect(step=0, policy=0)
        stale = s.drop_stale(step=2)
        await s.close()
        return stale

    assert [g.counted_step for g in asyncio.run(scenario())] == [0, 0], "the two groups left over"


def test_with_partial_rollouts_a_group_in_flight_is_not_cancelled_as_stale() -> None:
    env = LabelledEnv([[[0], [0]]] * 4, hang=frozenset({3}))
    s = scheduler(env, partial_rollouts=True)

    async def scenario() -> list[Group]:
        await s.collect(step=0, policy=0)
        stale = s.drop_stale(step=2)
        await s.close()
        return stale

    stale = asyncio.run(scenario())
    assert len(stale) == 1 and env.cancelled == [3], "only the finished group is dropped; close() cancels the other"


def refilled_batch(env: InfraFailingEnv, refill: int) -> list[Group]:
    s = scheduler(env, max_steps=1, refill_rollouts=refill)  # one step: two groups, no more

    async def scenario() -> list[Group]:
        batch = await s.collect(step=0, policy=0)
        await s.close()
        return batch

    return asyncio.run(scenario())


def test_an_infra_failed_rollout_is_refilled_alone_within_the_steps_budget() -> None:
    # calls 0 and 1: the first two groups, each with its first rollout dead; budget: one refill
    env = InfraFailingEnv(fail=frozenset({0, 1}))
    batch = refilled_batch(env, refill=1)
    refills = [call for call, attempt in zip(env.calls, env.attempts, strict=True) if attempt > 0]
    assert len(refills) == 1, "one rollout run again, not its group"
    assert refills[0] in env.calls[:2], "rollout 0 of a failed group: its own seed, salted by the attempt"
    outcomes = sorted([t.outcome for t in g.traces] for g in batch)
    assert outcomes == [["infra_error", "scored"], ["scored", "scored"]], "the budget spent, the other failure stays"
    assert [t.outcome for g in batch for t in g.replaced] == ["infra_error"], "the replaced attempt, kept"


def test_a_group_scored_env_is_never_refilled() -> None:
    env = InfraFailingEnv(fail=frozenset({0}), group_scoring=True)
    batch = refilled_batch(env, refill=4)
    assert max(env.attempts) == 0, "no refill"
    assert sorted(t.outcome for g in batch for t in g.traces).count("infra_error") == 1
