"""The rollout data model: a `Trace` is validated strictly when built and at every process boundary, round-trips exactly
through JSON and msgpack, and its derived numbers are properties, never serialised."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Message = dict[str, Any]
"""An OpenAI-style chat message: `role`, `content`, optional `tool_calls` / `tool_call_id`."""

Split = Literal["train", "eval"]
"""Which task list a task comes from; eval tasks never feed training."""

Outcome = Literal["scored", "truncated", "env_error", "infra_error", "cancelled"]
"""What became of a rollout (`Trace.outcome`): scored (a reward, ended by itself), truncated (cut
short: max tokens, turns, context or a deadline; it may still carry a reward), env_error (the env's
own code failed, or gave no reward), infra_error (what runs the rollout failed: its env worker,
env server, model server or sandbox died or did not answer, retries spent), cancelled (stale or
cancelled: abandoned, not failed)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

INFRA_ERRORS = frozenset(
    {
        "worker_died",  # the env worker process died running it (serve/protocol.py), re-runs spent
        "unavailable",  # the env server was lost and not back (envclient/client.py)
        "at_capacity",  # the env server refused it: every slot busy, its queue full
        "shutting_down",  # the env server was draining
        "internal_error",  # a bug in the env server, not in the env
        "model_unavailable",  # the model server did not answer or failed (runtime/http.py)
        "sandbox_error",  # the sandbox itself failed (sandbox/errors.py) ...
        "sandbox_start",
        "sandbox_died",
        "sandbox_closed",
    }
)
"""`Error.type`s of a failure of what runs the rollout rather than of the env's code."""
CANCELLED_ERRORS = frozenset({"cancelled", "stale"})
"""`Error.type`s of a rollout that was abandoned (cancelled, or dropped as too old to train on)."""
DEADLINE_ERRORS = frozenset({"timeout", "sandbox_timeout"})
"""`Error.type`s of a rollout stopped at its wall-clock deadline: truncated when the rollout's own
deadline stopped it (`is_truncated`); a client that gave up on a silent server is infra."""


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", ser_json_inf_nan="constants")


class Task(StrictModel):
    """One task of an environment. Environments subclass it with their own fields."""

    idx: int


class WireTask(Task):
    """A task as the orchestrator sees it: the env's own fields kept, but not typed."""

    model_config = ConfigDict(extra="allow")


class TurnTokens(StrictModel):
    """The exact tokens of one model call, as the inference server saw and produced them."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    """Logprob of each sampled completion token under the inference policy."""
    completion_policy_steps: list[int | None] | None = None
    """The policy step whose weights sampled each completion token (None for a token of weights
    without a step, such as the run's initial model); None when the server does not say. A call
    that a weight reload interrupted (partial rollouts) holds two steps or more."""

    @model_validator(mode="after")
    def _logprobs_match_completion(self) -> TurnTokens:
        if len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.completion_logprobs)} logprobs; "
                "logprobs must be given for every sampled token, never padded or truncated"
            )
        steps = self.completion_policy_steps
        if steps is not None and len(steps) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(steps)} policy steps; "
                "a policy step must be given for every sampled token, or none"
            )
        return self


class Turn(StrictModel):
    """One model call: what it was shown, what it answered, and the tokens of both."""

    prompt: list[Message]
    response: Message
    tokens: TurnTokens | None = None
    """None for a model behind a plain chat API; back-filled from the chat template later."""
    finish_reason: str | None = None
    tools: list[dict[str, Any]] | None = None
    """The tool schemas the model was shown in this call (None: no tools)."""


class Branch(StrictModel):
    """Turns whose token contexts extend one another; one training sample each."""

    turns: list[Turn] = Field(default_factory=list)


class Error(StrictModel):
    type: str
    """A short machine-readable kind: an exception class name, `timeout`, `worker_died`, ..."""
    message: str
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> Error:
        """The error of `exc`: its `error_type` attribute when it has one (a typed failure such as
        `agent_timeout`), else its class name."""
        import traceback

        return cls(
            type=getattr(exc, "error_type", None) or type(exc).__name__,
            message=str(exc) or repr(exc),
            traceback="".join(traceback.format_exception(exc)),
        )


class Span(StrictModel):
    """A wall-clock interval (seconds since the epoch)."""

    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timing(StrictModel):
    setup: Span | None = None
    """Before the first model call: the env's `setup` (a tool env's instance, its sandbox's start)."""
    generation: Span | None = None
    """The episode: model calls and the env's answers, tool calls included."""
    scoring: Span | None = None
    tools: dict[str, float] = Field(default_factory=dict)
    """Seconds spent in each tool, by tool name, summed over the rollout's calls (inside
    `generation`: the model's own share is generation minus these)."""

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """Record the time spent in the `with` block as `phase` (setup/generation/scoring)."""
        start = time.time()
        try:
            yield
        finally:
            setattr(self, phase, Span(start=start, end=time.time()))


class Trace(StrictModel):
    """One rollout of one task: its branches of turns, its reward, and what went wrong if anything."""

    task: WireTask
    branches: list[Branch] = Field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: Error | None = None
    timing: Timing = Field(default_factory=Timing)
    is_truncated: bool = False
    """The rollout was cut short (max tokens, max turns or a timeout) rather than finishing."""
    stop_reason: str | None = None
    """Why the rollout ended: `completed`, `max_turns`, `max_tokens`, `episode_tokens`,
    `context_length`, `tool_ended`, `error`, ..."""
    trailing_messages: list[Message] = Field(default_factory=list)
    """Env and tool messages that came after the last model turn (the final "Correct!", the last
    tool results): part of the episode, though no model call saw them."""

    @property
    def has_error(self) -> bool:
        return self.error is not None

    @property
    def outcome(self) -> Outcome:
        """What became of this rollout (`Outcome`), derived here only, from its error type,
        truncation and reward."""
        if self.error is not None:
            kind = self.error.type
            if kind in CANCELLED_ERRORS:
                return "cancelled"
            if kind in DEADLINE_ERRORS and (self.is_truncated or kind == "sandbox_timeout"):
                return "truncated"
            if kind in INFRA_ERRORS or kind in DEADLINE_ERRORS:
                return "infra_error"
            return "env_error"
        if self.reward is None:
            return "env_error"  # the env returned no reward and said nothing
        return "truncated" if self.is_truncated else "scored"

    @property
    def in_baseline(self) -> bool:
        """Whether the rollout enters its group's baseline: a reward and no error (scored, or
        truncated with a reward)."""
        return self.error is None and self.reward is not None

    @property
    def turns(self) -> list[Turn]:
        return [turn for branch in self.branches for turn in branch.turns]

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def completion_len(self) -> int:
        """Tokens the policy generated, over all turns (0 for token-less turns)."""
        return sum(len(turn.tokens.completion_ids) for turn in self.turns if turn.tokens)

    @property
    def total_tokens(self) -> int:
        """Tokens in the final context of every branch: what training on this trace costs."""
        total = 0
        for branch in self.branches:
            last = next((t.tokens for t in reversed(branch.turns) if t.tokens), None)
            if last is not None:
                total += len(last.prompt_ids) + len(last.completion_ids)
        return total

    def to_wire(self) -> dict[str, Any]:
        """A plain map for msgpack (floats stay floats; inf and nan pass through unchanged)."""
        return self.model_dump(mode="python", round_trip=True)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Trace:
        return cls.model_validate(data)

    @classmethod
    def from_error(cls, task: Task | dict[str, Any], error: Error, **fields: Any) -> Trace:
        """A Trace that says only what went wrong: reward None, no branches."""
        wire_task = WireTask.model_validate(task.model_dump() if isinstance(task, Task) else task)
        return cls(task=wire_task, error=error, stop_reason="error", **fields)
