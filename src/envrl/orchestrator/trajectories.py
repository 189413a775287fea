"""Traces into samples: each sample is one token sequence whose turns extend one another, generated tokens trained
and everything else masked; a turn that does not extend starts a new sample (never spliced or re-tokenised)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from envrl.data.samples import TOKEN_FIELDS, TrainingSample
from envrl.data.traces import Trace, Turn, TurnTokens
from envrl.model.client import SamplingArgs

UNKNOWN_LOGPROB = math.nan
"""Inference logprob of a back-filled token: the behaviour policy's value is unknown, so the
trainer treats such tokens as on-policy (importance ratio 1)."""


class TokenBackfill:
    """Gives token-less turns (a model behind a plain chat API) the tokens the student would see.

    The prompt is rendered with the student's chat template and a generation prompt, then prompt
    plus response without one; the completion is what follows their longest common prefix, cut
    after the first end-of-sequence token (template text after it was never generated).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, turn: Turn) -> TurnTokens:
        prompt_ids = self._render(turn.prompt, add_generation_prompt=True)
        full_ids = self._render([*turn.prompt, turn.response], add_generation_prompt=False)
        split = _common_prefix_len(prompt_ids, full_ids)
        completion_ids = full_ids[split:]
        eos = self.tokenizer.eos_token_id
        if eos in completion_ids:
            completion_ids = completion_ids[: completion_ids.index(eos) + 1]
        return TurnTokens(
            prompt_ids=full_ids[:split],
            completion_ids=completion_ids,
            completion_logprobs=[UNKNOWN_LOGPROB] * len(completion_ids),
        )

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def token_policy_steps(tokens: TurnTokens, unlabelled: int) -> list[int]:
    """The policy step of each completion token; `unlabelled` for those the server gave none."""
    steps = tokens.completion_policy_steps or [None] * len(tokens.completion_ids)
    return [unlabelled if step is None else step for step in steps]


def oldest_policy_step(traces: list[Trace], unlabelled: int) -> int:
    """The oldest policy step of any generated token of `traces` (`unlabelled` for tokens the
    server gave no step, and when there is no token at all): what the off-policy bound counts."""
    steps = [
        min(token_policy_steps(turn.tokens, unlabelled))
        for trace in traces
        for turn in trace.turns
        if turn.tokens is not None and turn.tokens.completion_ids
    ]
    return min(steps, default=unlabelled)


class _SampleBuilder:
    def __init__(self) -> None:
        self.input_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.policy_steps: list[int] = []

    def extends(self, prompt_ids: list[int]) -> bool:
        return prompt_ids[: len(self.input_ids)] == self.input_ids

    def add(self, tokens: TurnTokens, unlabelled: int) -> None:
        context = tokens.prompt_ids[len(self.input_ids) :]
        self.input_ids += context + tokens.completion_ids
        self.loss_mask += [0] * len(context) + [1] * len(tokens.completion_ids)
        self.logprobs += [0.0] * len(context) + list(tokens.completion_logprobs)
        self.policy_steps += [-1] * len(context) + token_policy_steps(tokens, unlabelled)


def trace_to_samples(
    trace: Trace,
    *,
    advantage: float,
    env: str,
    policy_step: int,
    sampling: SamplingArgs,
    backfill: Callable[[Turn], TurnTokens] | None = None,
) -> list[TrainingSample]:
    """One sample per branch (more if a branch's turns stop extending one another).

    `sampling` is what the env's rollouts were sampled with: its temperature, top_p and top_k go
    into every sample, so the trainer scores the tokens under the distribution that sampled them.
    `policy_step` is the step the off-policy bound counts the samples as, and the step of every
    token the server gave none (back-filled ones, those of weights loaded without a step).

    Raises ValueError for a token-less turn when no `backfill` is given. Samples with no
    generated token are left out: they would train nothing.
    """
    builders: list[_SampleBuilder] = []
    for branch in trace.branches:
        builder = _SampleBuilder()
        builders.append(builder)
        for turn in branch.turns:
            tokens = turn.tokens
            if tokens is None:
                if backfill is None:
                    raise ValueError(
                        f"task {trace.task.idx} of env {env!r} has a turn without tokens and no back-fill tokenizer"
                    )
                tokens = backfill(turn)
            if not builder.extends(tokens.prompt_ids):
                builder = _SampleBuilder()
                builders.append(builder)
            builder.add(tokens, policy_step)
    return [
        TrainingSample(
            input_ids=b.input_ids,
            loss_mask=b.loss_mask,
            inference_logprobs=b.logprobs,
            policy_steps=b.policy_steps,
            advantage=advantage,
            env=env,
            task_idx=trace.task.idx,
            policy_step=policy_step,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
        )
        for b in builders
        if any(b.loss_mask)
    ]


SeqLenPolicy = Literal["truncate", "drop"]


@dataclass
class SeqLenCounts:
    """What `fit_seq_len` did to one env's samples."""

    samples: int = 0
    truncated: int = 0
    """Kept, cut to `seq_len` tokens."""
    dropped: int = 0
    """Left out: longer than `seq_len` under `drop`, or nothing trainable left after the cut."""
    tokens_cut: int = 0
    """Tokens removed by truncation (trained tokens among them are lost to the loss)."""


def fit_seq_len(
    samples: list[TrainingSample], seq_len: int | None, policy: SeqLenPolicy, counts: SeqLenCounts
) -> list[TrainingSample]:
    """Samples no longer than `seq_len` tokens: longer ones cut (tokens past it leave the sample,
    so none of them is trained) or dropped, per `policy`; `counts` adds up what happened."""
    counts.samples += len(samples)
    if seq_len is None:
        return samples
    fitted = []
    for sample in samples:
        excess = len(sample.input_ids) - seq_len
        if excess <= 0:
            fitted.append(sample)
            continue
        if policy == "truncate" and any(sample.loss_mask[1:seq_len]):
            counts.truncated += 1
            counts.tokens_cut += excess
            cut = {key: getattr(sample, key)[:seq_len] for key in TOKEN_FIELDS}
            fitted.append(sample.model_copy(update=cut))
        else:
            counts.dropped += 1
    return fitted
