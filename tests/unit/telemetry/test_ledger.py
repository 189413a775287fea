"""The time ledger's writer and reader on real files: buffering, cut lines, resumed writers."""

from __future__ import annotations

from pathlib import Path

from envrl.data.layout import ledger_file
from envrl.telemetry.ledger import Ledger, read_ledger, read_ledger_file


def test_spans_are_buffered_until_flush_then_read_back_with_their_fields(tmp_path: Path) -> None:
    ledger = Ledger.of(tmp_path, "trainer")
    with ledger.span("compute", 3, micro_batches=2):
        pass
    ledger.record("generation", 3, 10.0, 12.5, process="inference", rollout=1)
    assert not ledger_file(tmp_path, "trainer").exists()

    ledger.flush()
    compute, generation = read_ledger_file(ledger_file(tmp_path, "trainer"))
    assert (compute.process, compute.name, compute.step, compute.model_extra) == (
        "trainer",
        "compute",
        3,
        {"micro_batches": 2},
    )
    assert compute.end >= compute.start
    assert (generation.process, generation.start, generation.duration) == ("inference", 10.0, 2.5)
    assert generation.model_extra == {"rollout": 1}


def test_a_span_is_recorded_when_its_block_raises(tmp_path: Path) -> None:
    ledger = Ledger.of(tmp_path, "orchestrator")
    try:
        with ledger.span("batching", 0):
            raise ValueError("boom")
    except ValueError:
        pass
    ledger.close()
    assert [s.name for s in read_ledger(tmp_path)] == ["batching"]


def test_a_cut_last_line_is_skipped_and_the_next_writer_starts_a_fresh_line(tmp_path: Path) -> None:
    first = Ledger.of(tmp_path, "orchestrator")
    first.record("wait_rollouts", 0, 1.0, 2.0)
    first.flush()
    path = ledger_file(tmp_path, "orchestrator")
    with path.open("a") as f:  # a crash in the middle of a write
        f.write('{"process": "orchestrator", "name": "batch')

    resumed = Ledger.of(tmp_path, "orchestrator")
    resumed.record("wait_rollouts", 1, 3.0, 4.0)
    resumed.flush()
    assert [(s.step, s.start) for s in read_ledger_file(path)] == [(0, 1.0), (1, 3.0)]
    assert len(path.read_text().splitlines()) == 3


def test_a_resumed_writer_replaces_the_spans_of_the_steps_it_does_again(tmp_path: Path) -> None:
    crashed = Ledger.of(tmp_path, "trainer")
    for step in (0, 1, 2):
        crashed.record("compute", step, float(step), step + 0.5)
    crashed.record("publish", 2, 2.5, 2.6)  # step 2 never finished: the resume trains it again
    crashed.flush()
    resumed = Ledger.of(tmp_path, "trainer")
    for step in (2, 3):
        resumed.record("compute", step, 10.0 + step, 10.5 + step)
    resumed.flush()

    spans = read_ledger(tmp_path)
    assert [(s.step, s.name, s.start) for s in spans] == [
        (0, "compute", 0.0),
        (1, "compute", 1.0),
        (2, "compute", 12.0),
        (3, "compute", 13.0),
    ]
    assert {s.run for s in spans if s.step < 2} == {crashed.run}


def test_a_ledger_without_a_file_records_nothing(tmp_path: Path) -> None:
    ledger = Ledger(None, "trainer")
    with ledger.span("compute", 0):
        pass
    ledger.close()
    assert read_ledger(tmp_path) == []
