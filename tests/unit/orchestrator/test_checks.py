"""Checks that fail loudly (issue 39): the decisions, driven by made-up steps and a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from loguru import logger

from envrl.config import ConfigError, resolve_config
from envrl.data.layout import stall_dump_file
from envrl.data.traces import Branch, Trace, Turn, WireTask
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.checks import off_policy_problem
from envrl.launcher.plan.run import plan
from envrl.model.tiny import CHAT_TEMPLATE
from envrl.orchestrator.checks import (
    CheckFailed,
    ChecksConfig,
    StepChecks,
    Streak,
    no_tool_call_cause,
    template_probe,
)
from envrl.orchestrator.watchdog import StallWatchdog
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]


def trace(reply: str, reward: float, tools: bool = True) -> Trace:
    turn = Turn(prompt=[{"role": "user", "content": "Go left."}], response={"role": "assistant", "content": reply},
                tools=TOOLS if tools else None)  # fmt: skip
    return Trace(task=WireTask(idx=0), branches=[Branch(turns=[turn])], reward=reward)


class Handle:
    name = "compass"
    client_config = None


def test_a_streak_reports_once_when_it_reaches_n_and_again_only_after_it_broke() -> None:
    streak = Streak()
    assert [streak.update(True, 2) for _ in range(4)] == [False, True, False, False]
    assert streak.update(False, 2) is False
    assert [streak.update(True, 2) for _ in range(2)] == [False, True]


def test_equal_rewards_in_every_group_for_n_steps_warn_once_and_strict_raises() -> None:
    warned: list[str] = []
    sink = logger.add(lambda m: warned.append(str(m)), level="WARNING", format="{message}")
    try:
        checks = StepChecks(ChecksConfig(zero_variance_steps=2), [Handle()])
        flat = [("compass", [trace("a", 1.0, tools=False), trace("b", 1.0, tools=False)])]
        mixed = [*flat, ("compass", [trace("a", 0.0, tools=False), trace("b", 1.0, tools=False)])]
        for step, groups in enumerate([flat, mixed, flat, flat, flat]):
            checks.after_step(step, groups)
    finally:
        logger.remove(sink)
    assert len(warned) == 1 and "every group had equal rewards for 2 steps (to step 3; rewards [1.0])" in warned[0]
    strict = StepChecks(ChecksConfig(strict=True, zero_variance_steps=1), [Handle()])
    with pytest.raises(CheckFailed, match="nothing is learned"):
        strict.after_step(0, flat)


def test_a_tool_env_with_calls_or_without_tools_is_not_reported() -> None:
    checks = StepChecks(ChecksConfig(strict=True, no_tool_call_steps=1), [Handle()])
    call = '<tool_call>{"name": "move", "arguments": {}}</tool_call>'
    parsed = trace("", 0.0)
    parsed.turns[0].response["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "move"}}]
    checks.after_step(0, [("compass", [parsed, trace(call, 1.0)])])
    checks.after_step(1, [("plain", [trace("x", 0.0, tools=False), trace("y", 1.0, tools=False)])])


@pytest.mark.parametrize(
    ("texts", "cause"),
    [
        (['[TOOL_CALLS]move[ARGS]{"direction": "left"}'], "writes mistral tool calls but its chat template is hermes"),
        (['<tool_call>{"name": move}</tool_call>'], "writes hermes tool-call markers but no call parses"),
        (["I go left."], "never writes a tool-call marker"),
    ],
)
def test_the_cause_of_no_tool_call_is_told_from_template_and_completions(texts: list[str], cause: str) -> None:
    assert cause in no_tool_call_cause(CHAT_TEMPLATE, True, texts, "m")


def test_a_template_that_teaches_no_syntax_or_shows_no_tools_is_named(tmp_path: Path) -> None:
    assert "does not render tools" in no_tool_call_cause(CHAT_TEMPLATE, False, ["x"], "m")
    assert "teaches no tool-call syntax" in no_tool_call_cause("{{ messages }}", True, ["x"], "m")
    template, renders = template_probe(str(DEFAULT_DIR))
    assert template == CHAT_TEMPLATE and renders is True
    assert template_probe(str(tmp_path)) == (None, None)


def test_no_off_policy_correction_with_async_is_a_warning_and_under_strict_a_config_error() -> None:
    assert off_policy_problem(0, False, None) is None
    assert off_policy_problem(1, (0.2, 0.2), None) is None and off_policy_problem(1, False, (0.5, 2.0)) is None
    assert "set trainer.loss.clip = [0.2, 0.2]" in (off_policy_problem(2, False, None) or "")
    unclipped = [("orchestrator.envs", '[{"id": "reverse-text"}]'), ("trainer.loss.clip", "false")]
    warned = plan(resolve_config(RLConfig, overrides=unclipped)).warnings  # rl logs each
    assert any("check: max_async_level = 1: samples may come from policies 1 step(s) old" in w for w in warned)
    with pytest.raises(ConfigError, match=r"no off-policy correction .* \(orchestrator.checks.strict\)"):
        plan(resolve_config(RLConfig, overrides=[*unclipped, ("orchestrator.checks.strict", "true")]))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watchdog_dumps_once_past_k_times_the_median_and_again_after_a_later_step(tmp_path: Path) -> None:
    clock = FakeClock()
    dog = StallWatchdog(output_dir=tmp_path, factor=3.0, min_s=0.0, strict=False, clock=clock,
                        describe=lambda: ["== orchestrator: 0 group(s) in flight"])  # fmt: skip
    clock.now += 1e6
    assert dog.check() is None, "no step has finished: no median, no limit"
    for step, seconds in enumerate([10.0, 30.0, 20.0]):  # median 20 s: the limit is 60 s
        dog.step_finished(step, seconds)
    clock.now += 60.0
    assert dog.check() is None
    clock.now += 0.5
    dump = dog.check()
    assert dump is not None and dump.startswith("stall: no step finished in 60 s since step 2 (limit 60 s = ")
    assert "== orchestrator: 0 group(s) in flight" in dump and "== orchestrator (pid " in dump
    assert stall_dump_file(tmp_path, 3).read_text() == dump
    assert dog.check() is None, "one dump per stall"
    dog.step_finished(3, 20.0)
    clock.now += 61.0
    assert dog.check() is not None and stall_dump_file(tmp_path, 4).exists()


def test_the_stall_limit_has_a_floor() -> None:
    dog = StallWatchdog(output_dir=Path("."), factor=10.0, min_s=300.0, strict=False, describe=list, history=[1.0])
    assert dog.limit() == 300.0


def test_a_stall_dump_opens_the_runs_report_headline(tmp_path: Path) -> None:
    from envrl.report.headline import headline

    dog = StallWatchdog(output_dir=tmp_path, factor=1.0, min_s=0.0, strict=False, clock=FakeClock(),
                        describe=lambda: ["== orchestrator: 2 group(s) in flight"], history=[1.0])  # fmt: skip
    dog.clock.now += 2.0  # type: ignore[attr-defined]
    dump = dog.check()
    assert dump is not None
    (stall,) = headline(tmp_path)["stalls"]
    assert stall["file"] == str(stall_dump_file(tmp_path, 0)) and "2 group(s) in flight" in stall["head"]
