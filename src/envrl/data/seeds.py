"""Sampling seeds: a model call's seed is a pure function of (run seed, rollout index, attempt, call index), so a run
is reproducible from its seed; train groups and eval grids derive their rollout index here and nowhere else."""

from __future__ import annotations

import hashlib

SEED_SPACE = 2**31
"""Seeds stay below this (vLLM and numpy accept them everywhere)."""


def rollout_seed(run_seed: int, index: int) -> int:
    """Seed of rollout `index` of a run; a group's rollouts take consecutive indices (and seeds)."""
    return (run_seed * 1_000_003 + index) % SEED_SPACE


def train_group_seed(run_seed: int, group: int, group_size: int) -> int:
    """First seed of the `group`-th train group drawn in a run (its rollouts take the next ones)."""
    return rollout_seed(run_seed, group * group_size)


def eval_seed(run_seed: int, task_idx: int, rollout: int, rollouts_per_task: int) -> int:
    """Seed of rollout `rollout` of eval task `task_idx` in a grid of `rollouts_per_task` rollouts
    per task: the same in the orchestrator's evals and the `eval` command, whatever ran before."""
    return rollout_seed(run_seed, task_idx * rollouts_per_task + rollout)


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of attempt `attempt` (0: the first) of a rollout whose first attempt uses `seed`.

    Retries are salted by hashing, so a retried rollout samples afresh instead of repeating the
    same tokens (and the same failure), and never lands on a neighbour's consecutive seed range
    except by chance.
    """
    return seed if attempt == 0 else _salted(seed, "retry", attempt)


def call_seed(seed: int, call: int) -> int:
    """The seed of model call `call` (0: the first) of a rollout whose first call uses `seed`.

    Every turn of a multi-turn rollout samples afresh: reusing the rollout's seed would make each
    later turn repeat the first turn's random draws. The first call keeps `seed` itself, so
    single-turn rollouts sample exactly as before.
    """
    return seed if call == 0 else _salted(seed, "call", call)


def _salted(seed: int, salt: str, n: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{salt}/{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_SPACE
