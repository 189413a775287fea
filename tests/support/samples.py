"""Made-up training samples for benchmarks and tests (never used by a real run, so not in the package).

Guarantee: `synthetic_samples` is a pure function of its arguments: the same call gives the same
valid samples (prompt tokens masked out, completion tokens with plausible negative logprobs,
advantages of both signs), so runs on them are reproducible.
"""

from __future__ import annotations

import random

from envrl.data.samples import TrainingSample


def synthetic_samples(
    count: int,
    *,
    prompt_len: tuple[int, int] = (4, 16),
    completion_len: tuple[int, int] = (4, 32),
    vocab_size: int = 1024,
    policy_step: int = 0,
    seed: int = 0,
    group_size: int = 1,
) -> list[TrainingSample]:
    """`count` samples with lengths drawn uniformly from the given inclusive ranges; each run of
    `group_size` consecutive samples has one prompt (a group's rollouts of one task)."""
    rng = random.Random(seed)
    samples = []
    prompt: list[int] = []
    for i in range(count):
        n_prompt, n_completion = rng.randint(*prompt_len), rng.randint(*completion_len)
        if i % group_size == 0:
            prompt = [rng.randrange(3, vocab_size) for _ in range(n_prompt)]
        n_prompt = len(prompt)
        samples.append(
            TrainingSample(
                input_ids=prompt + [rng.randrange(3, vocab_size) for _ in range(n_completion)],
                loss_mask=[0] * n_prompt + [1] * n_completion,
                inference_logprobs=[0.0] * n_prompt + [-rng.uniform(4.0, 9.0) for _ in range(n_completion)],
                advantage=1.0 if i % 2 == 0 else -1.0,
                env="synthetic",
                task_idx=i,
                policy_step=policy_step,
            )
        )
    return samples
