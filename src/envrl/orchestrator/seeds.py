"""Sampling seeds of rollouts: one formula for training, evaluation and retries.

Guarantee: a rollout's seed is a pure function of the run seed, the rollout's index in its run
and its attempt number, so a run is reproducible from its seed; the first attempt of rollout i
gets `rollout_seed(run_seed, i)` and every retry draws a different seed from the attempts before.
"""

from __future__ import annotations

import hashlib

SEED_SPACE = 2**31
"""Seeds stay below this (vLLM and numpy accept them everywhere)."""


def rollout_seed(run_seed: int, index: int) -> int:
    """Seed of rollout `index` of a run; a group's rollouts take consecutive indices (and seeds)."""
    return (run_seed * 1_000_003 + index) % SEED_SPACE


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of attempt `attempt` (0: the first) of a rollout whose first attempt uses `seed`.

    Retries are salted by hashing, so a retried rollout samples afresh instead of repeating the
    same tokens (and the same failure), and never lands on a neighbour's consecutive seed range
    except by chance.
    """
    if attempt == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/retry/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_SPACE
