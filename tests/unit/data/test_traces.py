"""The rollout data model: exact JSON and msgpack round-trips, derived properties, validation."""

import math

import msgpack
import pytest
from pydantic import ValidationError

from envrl.data.traces import Branch, Error, Span, Task, Timing, Trace, Turn, TurnTokens, WireTask


class CountTask(Task):
    prompt: str
    target: int


def two_branch_trace() -> Trace:
    first = Turn(
        prompt=[{"role": "user", "content": "hi"}],
        response={"role": "assistant", "content": "yo"},
        tokens=TurnTokens(prompt_ids=[1, 2, 3], completion_ids=[4, 5], completion_logprobs=[-0.5, -1.25]),
        finish_reason="stop",
    )
    second = Turn(
        prompt=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "?"},
        ],
        response={"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        tokens=TurnTokens(prompt_ids=[1, 2, 3, 4, 5, 6, 7], completion_ids=[8], completion_logprobs=[-float("inf")]),
        finish_reason="length",
    )
    untokenised = Turn(prompt=[{"role": "user", "content": "summary"}], response={"role": "assistant", "content": "s"})
    task = WireTask.model_validate(CountTask(idx=7, prompt="1 2", target=3).model_dump())
    return Trace(
        task=task,
        branches=[Branch(turns=[first, second]), Branch(turns=[untokenised])],
        reward=0.75,
        metrics={"lcs": 0.5, "nan_metric": float("nan")},
        timing=Timing(setup=Span(start=1.0, end=1.5), generation=Span(start=1.5, end=3.0)),
        is_truncated=True,
        stop_reason="max_tokens",
    )


def assert_same(a: Trace, b: Trace) -> None:
    """Equal, with nan == nan (which plain == would deny)."""
    assert math.isnan(b.metrics["nan_metric"])
    assert a.model_copy(update={"metrics": {}}) == b.model_copy(update={"metrics": {}})
    assert {k: v for k, v in a.metrics.items() if k != "nan_metric"} == {
        k: v for k, v in b.metrics.items() if k != "nan_metric"
    }


def test_trace_round_trips_through_msgpack() -> None:
    trace = two_branch_trace()
    back = Trace.from_wire(msgpack.unpackb(msgpack.packb(trace.to_wire()), raw=False))
    assert_same(trace, back)
    assert back.task.model_extra == {"prompt": "1 2", "target": 3}


def test_trace_round_trips_through_json() -> None:
    trace = two_branch_trace()
    back = Trace.model_validate_json(trace.model_dump_json())
    assert_same(trace, back)
    assert back.branches[0].turns[1].tokens.completion_logprobs == [-float("inf")]


def test_derived_properties_follow_the_data_and_are_not_serialised() -> None:
    trace = two_branch_trace()
    assert (trace.has_error, trace.num_turns, trace.completion_len) == (False, 3, 3)
    assert trace.total_tokens == 7 + 1  # last tokenised turn of branch 0; branch 1 has no tokens
    for key in ("has_error", "num_turns", "completion_len", "total_tokens"):
        assert key not in trace.to_wire() and key not in trace.model_dump_json()


def test_error_trace_carries_type_message_and_traceback() -> None:
    try:
        raise ValueError("bad state")
    except ValueError as e:
        trace = Trace.from_error(CountTask(idx=1, prompt="p", target=2), Error.from_exception(e))
    assert trace.has_error and trace.reward is None and trace.stop_reason == "error"
    assert (trace.error.type, trace.error.message) == ("ValueError", "bad state")
    assert "raise ValueError" in trace.error.traceback
    assert Trace.from_wire(msgpack.unpackb(msgpack.packb(trace.to_wire()))) == trace


def test_logprobs_must_match_completion_length() -> None:
    with pytest.raises(ValidationError, match="never padded or truncated"):
        TurnTokens(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-1.0])


def test_wire_data_is_validated_strictly() -> None:
    wire = two_branch_trace().to_wire()
    wire["reward"] = "0.75"
    with pytest.raises(ValidationError):
        Trace.from_wire(wire)
    wire = two_branch_trace().to_wire()
    wire["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        Trace.from_wire(wire)


def test_timing_measure_records_the_span_even_when_the_block_fails() -> None:
    timing = Timing()
    with pytest.raises(RuntimeError), timing.measure("scoring"):
        raise RuntimeError("boom")
    assert timing.scoring is not None and timing.scoring.duration >= 0


def test_policy_steps_must_match_completion_length() -> None:
    TurnTokens(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-1.0, -1.0], completion_policy_steps=[0, 1])
    with pytest.raises(ValidationError, match="2 completion ids but 1 policy steps"):
        TurnTokens(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-1.0, -1.0], completion_policy_steps=[0])


def failed(kind: str, **fields) -> Trace:
    return Trace.from_error(WireTask(idx=0), Error(type=kind, message="m"), **fields)


@pytest.mark.parametrize(
    ("trace", "outcome"),
    [
        (Trace(task=WireTask(idx=0), reward=0.0), "scored"),
        (Trace(task=WireTask(idx=0), reward=1.0, is_truncated=True), "truncated"),
        (failed("timeout", is_truncated=True), "truncated"),  # the env server stopped it at its deadline
        (failed("sandbox_timeout"), "truncated"),  # the episode's wall-clock cap
        (failed("timeout"), "infra_error"),  # the client gave up on a silent server
        (failed("worker_died"), "infra_error"),
        (failed("unavailable"), "infra_error"),
        (failed("model_unavailable"), "infra_error"),
        (failed("sandbox_start"), "infra_error"),
        (failed("RuntimeError"), "env_error"),
        (failed("reward_error"), "env_error"),
        (failed("sandbox_oom"), "env_error"),  # the model's code broke a limit the env treats as fatal
        (Trace(task=WireTask(idx=0)), "env_error"),  # no error, no reward
        (failed("stale"), "cancelled"),
        (failed("cancelled"), "cancelled"),
    ],
)
def test_every_rollout_has_one_outcome_from_its_error_truncation_and_reward(trace: Trace, outcome: str) -> None:
    assert trace.outcome == outcome
    assert trace.in_baseline is (trace.error is None and trace.reward is not None)


def test_a_model_server_that_never_answers_is_an_infra_error_and_a_refusal_is_not() -> None:
    from envrl.runtime.http import HttpCallError

    assert Error.from_exception(HttpCallError("no answer")).type == "model_unavailable"
    assert Error.from_exception(HttpCallError("HTTP 503", status=503)).type == "model_unavailable"
    assert Error.from_exception(HttpCallError("HTTP 400", status=400)).type == "HttpCallError"
