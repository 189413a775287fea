"""The report's time split and Chrome trace, from a ledger written by the real writer: every
instant of a step goes to exactly one part, and nested spans stay on one row of their track."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envrl.report.main import write_report
from envrl.report.timeline import PARTS, chrome_trace, step_splits
from envrl.telemetry.ledger import Ledger, read_ledger
from tests.support.report_runs import write_metrics

T0 = 1_700_000_000.0  # wall-clock seconds, as time.time() gives them


def write_two_steps(out: Path) -> None:
    """Trainer steps 0 and 1, and what the orchestrator, inference and env did for batch 1."""
    trainer, orchestrator = Ledger.of(out, "trainer"), Ledger.of(out, "orchestrator")
    for step, spans in {
        0: [("wait_batch", 0, 10), ("read_batch", 10, 11), ("compute", 11, 15), ("publish", 15, 16)],
        1: [("wait_batch", 16, 22), ("read_batch", 22, 22.5), ("compute", 22.5, 26), ("publish", 26, 27),
            ("checkpoint", 27, 28)],
    }.items():  # fmt: skip
        for name, start, end in spans:
            trainer.record(name, step, T0 + start, T0 + end)
    orchestrator.record("step", 1, T0 + 15.5, T0 + 21)
    orchestrator.record("wait_policy", 1, T0 + 15.5, T0 + 16.5)
    orchestrator.record("reload_weights", 1, T0 + 16.5, T0 + 17, process="inference")
    orchestrator.record("wait_rollouts", 1, T0 + 17.3, T0 + 20)
    orchestrator.record("dispatch", 1, T0 + 17.3, T0 + 17.4)
    orchestrator.record("batching", 1, T0 + 20, T0 + 21)
    for rollout, shift in ((0, 0.0), (1, 0.2)):  # two rollouts overlapping in time
        orchestrator.record("rollout", 1, T0 + 17.4, T0 + 19.5 + shift, process="env a", rollout=rollout)
        orchestrator.record("env_queue", 1, T0 + 17.4, T0 + 17.5, process="env a", rollout=rollout)
        orchestrator.record("generation", 1, T0 + 17.5, T0 + 19, process="inference", rollout=rollout)
        orchestrator.record("scoring", 1, T0 + 19 + shift, T0 + 19.5 + shift, process="env a", rollout=rollout)
    trainer.close()
    orchestrator.close()


def test_each_steps_wall_time_is_split_into_parts_that_sum_to_it(tmp_path: Path) -> None:
    write_two_steps(tmp_path)
    first, second = step_splits(read_ledger(tmp_path))

    # step 0: nothing recorded what the trainer's first wait was for
    assert (first.start, first.end) == (T0, T0 + 16)
    assert first.parts["unaccounted"] == pytest.approx(10, abs=1e-6)
    assert first.accounted == pytest.approx(6 / 16, abs=1e-6)
    # step 1: from the end of step 0 to its checkpoint's end
    assert (second.start, second.end) == (T0 + 16, T0 + 28)
    expected = {
        "wait_policy": 0.5, "reload_weights": 0.5, "unaccounted": 0.3, "dispatch": 0.1, "env_queue": 0.1,
        "generation": 1.5, "scoring": 0.7, "rollout_other": 0.3, "batching": 1.0, "batch_poll": 1.0,
        "read_batch": 0.5, "compute": 3.5, "publish": 1.0, "checkpoint": 1.0,
    }  # fmt: skip
    # times near 1.7e9 s carry ~2.4e-7 s of float64 rounding each
    assert second.parts == pytest.approx({**dict.fromkeys(PARTS, 0.0), **expected}, abs=1e-5)
    assert sum(second.parts.values()) == pytest.approx(second.wall, abs=1e-5)
    assert second.accounted == pytest.approx(1 - 0.3 / 12, abs=1e-6)


def test_the_chrome_trace_has_a_track_per_process_with_nested_spans_on_one_row(tmp_path: Path) -> None:
    write_two_steps(tmp_path)
    trace = json.loads(json.dumps(chrome_trace(read_ledger(tmp_path))))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["env a", "inference", "orchestrator", "trainer"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(read_ledger(tmp_path))
    assert min(e["ts"] for e in spans) == 0

    def rows(process: str, name: str) -> list[int]:
        return [e["tid"] for e in spans if names[e["pid"]] == process and e["name"] == name]

    # the orchestrator's step holds its phases: one row; overlapping rollouts: a row each
    assert set(
        rows("orchestrator", "step") + rows("orchestrator", "wait_rollouts") + rows("orchestrator", "dispatch")
    ) == {1}
    assert sorted(rows("env a", "rollout")) == [1, 2]
    assert sorted(rows("inference", "generation")) == [1, 2]  # the reload ended before: row 1 is free again
    for e in spans:  # a rollout's phases on its row
        if names[e["pid"]] == "env a":
            parent = next(o for o in spans if o["name"] == "rollout" and o["args"] == e["args"])
            assert e["tid"] == parent["tid"]
    for e in spans:
        row = [o for o in spans if o["pid"] == e["pid"] and o["tid"] == e["tid"] and o is not e]
        for o in row:  # spans sharing a row are disjoint or nested
            a, b = (e["ts"], e["ts"] + e["dur"]), (o["ts"], o["ts"] + o["dur"])
            assert a[1] <= b[0] or b[1] <= a[0] or (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1])


def test_the_report_writes_the_ledger_as_timeline_json(tmp_path: Path) -> None:
    write_metrics(tmp_path, 2)
    write_two_steps(tmp_path)
    report = write_report(tmp_path).parent

    timeline = json.loads((report / "timeline.json").read_text())
    assert timeline == json.loads(json.dumps(chrome_trace(read_ledger(tmp_path))))
    assert (report / "plots" / "time_split.png").stat().st_size > 0
