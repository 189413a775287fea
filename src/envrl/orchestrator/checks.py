"""Checks that fail loudly: a streak of steps with no parseable tool call or no reward variance warns once with its
cause and fix (raises `CheckFailed` under `checks.strict`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger
from pydantic import Field

from envrl.config import BaseConfig
from envrl.data.traces import Trace
from envrl.model.tool_calls import Family, families_written, family_of
from envrl.telemetry.metrics import MetricsSink

PROBE_TOOL = {
    "type": "function",
    "function": {"name": "envrl_probe_tool", "description": "probe", "parameters": {"type": "object"}},
}
"""A tool rendered into the chat template to see whether the template shows tools at all."""


class ChecksConfig(BaseConfig):
    """`[orchestrator.checks]`: what the run checks and whether a failed check stops it."""

    strict: bool = False
    """A failed check stops the run with its message (exit 3, not restarted by `rl`) instead of a warning line."""
    no_tool_call_steps: int = Field(5, ge=1)
    """Steps in a row in which a tool env's rollouts hold no parseable tool call before it is reported."""
    zero_variance_steps: int = Field(5, ge=1)
    """Steps in a row in which every group's rewards are equal before it is reported."""
    stall_factor: float = Field(10.0, gt=0)
    """No step finished within this many times the median step time: dump every role's stacks."""
    stall_min_s: float = Field(300.0, ge=0)
    """The stall limit is never below this many seconds (reloads and evals make some steps slow)."""


class CheckFailed(RuntimeError):
    """A check failed under `checks.strict`; the message names the cause and the fix."""


def report(message: str, strict: bool) -> None:
    """One warning line, or the run stops with it (`strict`)."""
    if strict:
        raise CheckFailed(message)
    logger.warning(message)


@dataclass
class Streak:
    """Consecutive steps a condition held, and whether this streak was already reported."""

    steps: int = 0
    reported: bool = False

    def update(self, holds: bool, needed: int) -> bool:
        """Count this step; True exactly once per streak, when it reaches `needed` steps."""
        if not holds:
            self.steps, self.reported = 0, False
            return False
        self.steps += 1
        if self.steps >= needed and not self.reported:
            self.reported = True
            return True
        return False


def has_tool_call(trace: Trace) -> bool:
    """A turn of `trace` holds a parsed tool call (structured, or parsed by the env from text)."""
    if trace.metrics.get("valid_tool_call_turns", 0) > 0:
        return True
    return any(turn.response.get("tool_calls") for turn in trace.turns)


def offered_tools(trace: Trace) -> bool:
    return any(turn.tools for turn in trace.turns)


def completion_texts(traces: Sequence[Trace]) -> list[str]:
    return [str(turn.response.get("content") or "") for trace in traces for turn in trace.turns]


def no_tool_call_cause(template: str | None, renders_tools: bool | None, texts: Sequence[str], model: str) -> str:
    """Why no tool call parsed, as far as the chat template and the completions tell."""
    family = family_of(template) if template else None
    written = set[Family]().union(*(families_written(t) for t in texts)) if texts else set()
    if renders_tools is False:
        return (
            f"the chat template of {model} does not render tools (a tool rendered into it does not appear), so the "
            "model never sees them; use a model whose template renders `tools`, or set the tokenizer to one"
        )
    if template is not None and family is None:
        return (
            f"the chat template of {model} teaches no tool-call syntax envrl parses (hermes, llama3, mistral): no "
            "parser matches its calls; use a model of a known family"
        )
    if family is not None and written and family not in written:
        return (
            f"the model writes {'/'.join(sorted(written))} tool calls but its chat template is {family}: the parser "
            f"is the wrong family; serve the model whose template matches its training, or fix the template"
        )
    if written:
        return (
            f"the model writes {'/'.join(sorted(written))} tool-call markers but no call parses (malformed JSON or "
            "unknown tool names: see rollouts/train.jsonl); warm-start with `rl sft` on demonstrations"
        )
    return (
        "the model never writes a tool-call marker (no parser matched any completion); it does not know the "
        "syntax yet: warm-start with `rl sft` on demonstrations (docs/agents.md), or prompt it to use the tools"
    )


class HasClient(Protocol):
    """An env handle: its name and the model client its rollouts use."""

    name: str
    client_config: Any


def tokenizer_of(client: Any) -> str | None:
    """The directory whose chat template a client renders with (a chat client's model: a guess)."""
    return getattr(client, "tokenizer", None) or getattr(client, "model", None)


@dataclass
class StepChecks:
    """The per-step checks of a run, fed each step's traces by the orchestrator loop; `envs`: the
    train env handles, whose clients say which chat template renders each env's prompts."""

    config: ChecksConfig
    envs: Sequence[HasClient]
    sink: MetricsSink | None = None
    """Where a fired check is also logged (`log_check`): the `rl` console, summary.json, the report."""
    tool_streaks: dict[str, Streak] = field(default_factory=dict)
    variance: Streak = field(default_factory=Streak)

    def after_step(self, step: int, groups: Sequence[tuple[str, list[Trace]]]) -> None:
        """Count step `step`'s groups (env name, traces) into every streak; report the ones that are due."""
        traces_by_env: dict[str, list[Trace]] = {}
        for env, traces in groups:
            traces_by_env.setdefault(env, []).extend(traces)
        self._tool_calls(step, traces_by_env)
        self._zero_variance(step, [[t.reward for t in traces if t.in_baseline] for _, traces in groups])

    def _tool_calls(self, step: int, traces_by_env: dict[str, list[Trace]]) -> None:
        n = self.config.no_tool_call_steps
        for env, traces in traces_by_env.items():
            tool_traces = [t for t in traces if offered_tools(t)]
            if not tool_traces:
                continue
            streak = self.tool_streaks.setdefault(env, Streak())
            if streak.update(not any(has_tool_call(t) for t in tool_traces), n):
                client = next((h.client_config for h in self.envs if h.name == env), None)
                tokenizer = tokenizer_of(client) or "?"
                template, renders = template_probe(tokenizer)
                cause = no_tool_call_cause(template, renders, completion_texts(tool_traces), tokenizer)
                self._fired(
                    step,
                    "no_tool_call",
                    f"check: tool env {env!r} made no parseable tool call in {n} steps (to step {step}): {cause}",
                )

    def _zero_variance(self, step: int, group_rewards: list[list[float]]) -> None:
        n = self.config.zero_variance_steps
        groups = [rewards for rewards in group_rewards if len(rewards) >= 2]
        flat = bool(groups) and all(max(r) == min(r) for r in groups)
        if self.variance.update(flat, n):
            values = sorted({r[0] for r in groups})[:5]
            self._fired(
                step,
                "zero_variance",
                f"check: every group had equal rewards for {n} steps (to step {step}; rewards {values}): advantages "
                "are all zero and nothing is learned; make the tasks harder or easier for this policy, raise "
                "group_size or the sampling temperature, or check the reward function",
            )

    def _fired(self, step: int, check: str, message: str) -> None:
        if self.sink is not None:
            self.sink.log_check(step, check, message)
        report(message, self.config.strict)


def template_probe(tokenizer_dir: str) -> tuple[str | None, bool | None]:
    """The chat template of `tokenizer_dir` and whether a tool rendered into it appears (None,
    None: no tokenizer there). Loaded only when a check fired: loading a tokenizer is slow."""
    try:
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    except (OSError, ValueError):
        return None, None
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    if template is None:
        return None, False
    messages = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[PROBE_TOOL], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return template, False
    return template, "envrl_probe_tool" in str(text)
