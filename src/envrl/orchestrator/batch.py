"""A step's groups as one batch of samples: each group recorded once, in order, before its samples; every rollout
counted once in `counters`, every group without advantages once in `dropped_groups`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from envrl.data.samples import TrainingSample
from envrl.data.traces import Turn, TurnTokens
from envrl.orchestrator.advantage import baseline, batch_reward_std, group_advantages, trained_rollouts
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.scheduler import Group
from envrl.orchestrator.trajectories import SeqLenCounts, TokenBackfill, fit_seq_len, trace_to_samples


class BatchBuilder:
    """Builds each step's samples with the run's advantage and `seq_len` settings, counting into
    the orchestrator's `counters`."""

    def __init__(self, config: OrchestratorConfig, counters: Counter[str]) -> None:
        self.config = config
        self.counters = counters
        self.seq_counts: dict[str, SeqLenCounts] = {}
        """Per env, what `seq_len` did to the current step's samples."""
        self._backfill: TokenBackfill | None = None

    def samples(self, groups: list[Group], record: Callable[[Group], None]) -> list[TrainingSample]:
        samples: list[TrainingSample] = []
        self.seq_counts = {group.env.name: SeqLenCounts() for group in groups}
        scored = [baseline(group.traces) for group in groups]
        rewards = [[t.reward for t in good if t.reward is not None] for good in scored]
        batch_std = batch_reward_std(rewards)
        for group, good, group_rewards in zip(groups, scored, rewards, strict=True):
            record(group)
            self.counters["error_rollouts"] += sum(t.has_error for t in group.traces)
            self.counters["unscored_rollouts"] += sum(not t.has_error and t.reward is None for t in group.traces)
            advantages = group_advantages(group_rewards, self.config.advantage, batch_std)
            if advantages is None:
                self.counters["dropped_groups"] += 1
                continue
            trained = trained_rollouts(good, advantages, self.config.advantage)
            self.counters["masked_truncated_rollouts"] += len(good) - len(trained)
            for trace, advantage in trained:
                made = trace_to_samples(
                    trace,
                    advantage=advantage,
                    env=group.env.name,
                    policy_step=group.counted_step,
                    sampling=group.env.sampling,
                    backfill=self._backfill_turn,
                )
                samples += fit_seq_len(
                    made, self.config.seq_len, self.config.seq_len_policy, self.seq_counts[group.env.name]
                )
        return samples

    def _backfill_turn(self, turn: Turn) -> TurnTokens:
        """Tokens for a token-less turn. The tokenizer loads on the first such turn, not before:
        most runs never see one, and loading transformers' tokenizer stack is slow enough to show
        in step 0's time (docs/measurements.md)."""
        if self._backfill is None:
            from transformers import AutoTokenizer

            self._backfill = TokenBackfill(AutoTokenizer.from_pretrained(self.config.model.name))
        return self._backfill(turn)
