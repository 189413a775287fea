"""The report's reading of a run directory: rollouts joined with the samples made from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envrl.data.layout import train_rollouts_file
from envrl.report.data import Rollout, parse_rollouts, step_rollouts, train_lines
from envrl.telemetry.metrics import read_metrics, series
from tests.support.report_runs import samples_of, trace, write_metrics, write_step


def rollouts_of(out: Path, step: int) -> list[Rollout]:
    return parse_rollouts(train_lines(out).get(step, []), f"step {step}")


def test_every_sample_is_attached_to_the_rollout_it_was_made_from(tmp_path: Path) -> None:
    traces = [
        trace(7, [5, 6, 2]),
        trace(7, error="timeout"),
        trace(7, [5, 6, 2], [9, 2]),  # same first tokens as the first rollout, and a second branch
        trace(7, [8, 2], reward=None),  # unscored: trained on nothing
        trace(3, [4, 4, 2]),
    ]
    made = [samples_of(traces[0]), [], samples_of(traces[2]), [], samples_of(traces[4])]
    write_step(tmp_path, 0, traces, [s for group in made for s in group])

    rollouts = step_rollouts(tmp_path, 0, rollouts_of(tmp_path, 0))

    assert [r.trace for r in rollouts] == traces
    assert [r.samples for r in rollouts] == made
    assert len(rollouts[2].samples) == 2


def test_a_sample_that_no_rollout_explains_is_left_out(tmp_path: Path) -> None:
    traces = [trace(1, [5, 2]), trace(2, [6, 2])]
    stranger = samples_of(trace(9, [7, 2]))
    write_step(tmp_path, 0, traces, [*samples_of(traces[0]), *stranger, *samples_of(traces[1])])

    rollouts = step_rollouts(tmp_path, 0, rollouts_of(tmp_path, 0))

    assert [r.samples for r in rollouts] == [samples_of(traces[0]), samples_of(traces[1])]


def test_rollouts_without_a_batch_yet_have_no_samples(tmp_path: Path) -> None:
    write_step(tmp_path, 0, [trace(1, [5, 2])], samples_of(trace(1, [5, 2])))
    write_step(tmp_path, 1, [trace(2, [6, 2])], samples_of(trace(2, [6, 2])))
    (tmp_path / "rollouts" / "step_1" / "batch.msgpack").unlink()
    (tmp_path / "rollouts" / "step_1").rmdir()

    assert [len(r.samples) for r in step_rollouts(tmp_path, 1, rollouts_of(tmp_path, 1))] == [0]
    assert [len(r.samples) for r in step_rollouts(tmp_path, 0, rollouts_of(tmp_path, 0))] == [1]


def test_cut_and_corrupt_rollout_lines_are_skipped(tmp_path: Path) -> None:
    write_step(tmp_path, 0, [trace(1, [5, 2]), trace(2, [6, 2])], [])
    path = train_rollouts_file(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    garbled = lines[0][:30] + "}\n"
    path.write_text("not json\n" + garbled + "".join(lines) + lines[0][:40])  # then a line being appended

    assert sorted(train_lines(tmp_path)) == [0]
    assert [r.trace.task.idx for r in rollouts_of(tmp_path, 0)] == [1, 2]


def test_metric_series_keep_the_last_line_of_a_step(tmp_path: Path) -> None:
    write_metrics(tmp_path, 3)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 1, "process": "orchestrator", "train/learnable/reward": 0.9}\n{"step": 2, "trun')

    assert series(read_metrics(tmp_path), "train/learnable/reward") == ([0, 1, 2], [0.0, 0.9, 0.2])


def test_tokens_read_as_transformers_decodes_them_without_importing_it() -> None:
    from transformers import AutoTokenizer

    from envrl.report.data import Detokenizer
    from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

    reference = AutoTokenizer.from_pretrained(DEFAULT_DIR)
    detok = Detokenizer(str(DEFAULT_DIR))
    ids = range(len(reference))  # every token, special ones included
    assert [detok(i) for i in ids] == [reference.decode([i]) or f"<{i}>" for i in ids]
    probe = "import sys; from envrl.report.data import Detokenizer; Detokenizer(sys.argv[1])(5); print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    imported = subprocess.run(
        [sys.executable, "-c", probe, str(DEFAULT_DIR)], capture_output=True, text=True, check=True
    )
    assert imported.stdout.strip() == "[]", imported
