"""The step console of `rl` and the standalone orchestrator: a line per step, read from a real
metrics.jsonl as it grows."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

from envrl.telemetry.console import ProgressBoard, RunConsole
from envrl.telemetry.metrics import MetricsSink, WandbConfig
from envrl.telemetry.progress import CLEAR_LINE


def sink(out: Path, process: str, resume_step: int | None = None) -> MetricsSink:
    return MetricsSink(
        out / "metrics.jsonl", WandbConfig(mode="disabled"), process=process, output_dir=out, resume_step=resume_step
    )


def log_step(orchestrator: MetricsSink, trainer: MetricsSink, step: int) -> None:
    orchestrator.log(
        step,
        {
            "train/learnable/reward": 0.25,
            "train/learnable/time_generation": 0.5,
            "train/error_rate": 0.5,
            "inflight": 8,
        },
    )
    trainer.log(
        step, {"trainer/wait_time_s": 1.0, "trainer/step_time_s": 2.0, "trainer/publish_time_s": 0.5,
               "trainer/staleness_mean": 1.0},
    )  # fmt: skip


def step_lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line.startswith("step ")]


def test_every_step_gets_one_line_with_its_numbers(tmp_path: Path) -> None:
    stream = io.StringIO()
    console = RunConsole(tmp_path, total_steps=3, stream=stream)
    orchestrator, trainer = sink(tmp_path, "orchestrator"), sink(tmp_path, "trainer")
    orchestrator.log(0, {"eval/learnable-eval/reward": 0.125})
    for step in range(3):
        log_step(orchestrator, trainer, step)
        if step == 1:
            console.poll()  # lines are picked up as they come, and never twice
    console.poll()

    lines = step_lines(stream)
    assert [line.split(" |")[0] for line in lines] == ["step 0 (1/3)", "step 1 (2/3)", "step 2 (3/3)"]
    assert "reward learnable 0.250" in lines[0] and "eval learnable-eval 0.125 @0" in lines[0]
    assert "(wait batch 1.0, train 2.0, publish 0.5, gen 0.5/rollout)" in lines[0]
    assert "in-flight 8" in lines[0] and "lag 1.00" in lines[0] and "errors 50%" in lines[0]
    assert lines[-1].endswith("ETA 0s")
    assert lines[0].endswith("ETA ?")  # the first step includes start-up: no estimate from it
    assert re.search(r"ETA \d", lines[1])
    assert (tmp_path / "logs" / "steps.log").read_text().splitlines() == lines


def test_eta_leaves_out_the_first_step_which_includes_start_up() -> None:
    board = ProgressBoard(total_steps=10)
    parts = {"trainer/step_time_s": 2.0, "trainer/publish_time_s": 0.5}
    first = board.feed({"step": 0, "process": "trainer", "time": 1000.0, "trainer/wait_time_s": 900.0, **parts})
    assert first is not None and first.endswith("ETA ?")
    second = board.feed({"step": 1, "process": "trainer", "time": 1010.0, "trainer/wait_time_s": 7.5, **parts})
    assert second is not None and second.endswith("ETA 1m20s")  # 8 steps left at the steady 10 s each
    whole = ProgressBoard(total_steps=1)
    only = whole.feed({"step": 0, "process": "trainer", "time": 1000.0, "trainer/wait_time_s": 900.0, **parts})
    assert only is not None and only.endswith("ETA 0s")  # nothing left: no estimate needed


def test_steps_log_keeps_earlier_lines_when_a_resumed_run_appends(tmp_path: Path) -> None:
    steps_log = tmp_path / "logs" / "steps.log"
    steps_log.parent.mkdir()
    steps_log.write_text("step 0 (1/2) | from the run before the resume\n")
    console = RunConsole(tmp_path, total_steps=2, stream=io.StringIO())
    log_step(sink(tmp_path, "orchestrator", resume_step=1), sink(tmp_path, "trainer", resume_step=1), 1)
    console.poll()
    lines = steps_log.read_text().splitlines()
    assert lines[0].endswith("from the run before the resume") and lines[1].startswith("step 1 (2/2)")


def test_earlier_runs_lines_are_skipped_and_a_resume_rewrite_prints_each_step_once(tmp_path: Path) -> None:
    earlier = time.time() - 600
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "time": earlier, "process": p, "trainer/step_time_s": 1.0}) + "\n"
            for s in range(3)
            for p in ("orchestrator", "trainer")
        )
    )
    stream = io.StringIO()
    console = RunConsole(tmp_path, total_steps=4, stream=stream)
    console.poll()
    assert step_lines(stream) == []

    orchestrator, trainer = sink(tmp_path, "orchestrator", resume_step=2), sink(tmp_path, "trainer", resume_step=2)
    for step in (2, 3):
        log_step(orchestrator, trainer, step)
    console.poll()

    assert [line.split(" |")[0] for line in step_lines(stream)] == ["step 2 (3/4)", "step 3 (4/4)"]


def test_started_console_drains_the_file_when_stopped(tmp_path: Path) -> None:
    stream = io.StringIO()
    console = RunConsole(tmp_path, total_steps=2, stream=stream, poll_s=3600)
    console.start()
    orchestrator, trainer = sink(tmp_path, "orchestrator"), sink(tmp_path, "trainer")
    for step in range(2):
        log_step(orchestrator, trainer, step)
    console.stop()
    console.stop()

    assert len(step_lines(stream)) == 2


def test_a_standalone_orchestrators_own_lines_end_its_steps(tmp_path: Path) -> None:
    stream = io.StringIO()
    console = RunConsole(tmp_path, total_steps=2, stream=stream, ends_with="orchestrator")
    orchestrator = sink(tmp_path, "orchestrator")
    orchestrator.log(0, {"eval/learnable-eval/reward": 0.125})
    for step in range(2):
        orchestrator.log(
            step,
            {"train/learnable/reward": 0.25, "train/learnable/time_generation": 0.5, "train/learnable/staleness": 1.0,
             "train/other/staleness": 0.0, "train/error_rate": 0.0, "inflight": 8, "perf/step_time": 3.0,
             "perf/wait_for_trainer": 0.5},
        )  # fmt: skip
        console.poll()
        assert len(step_lines(stream)) == step + 1, "a step is printed as soon as the orchestrator wrote it"

    first, second = step_lines(stream)
    assert first.startswith("step 0 (1/2) | reward learnable 0.250 | eval learnable-eval 0.125 @0 | 3.0 s ")
    assert "(wait policy 0.5, gen 0.5/rollout) | in-flight 8 | lag 0.50 | errors 0% | ETA" in first
    assert second.startswith("step 1 (2/2)") and second.endswith("ETA 0s")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_status_line_stays_below_step_lines_and_goes_at_the_end(tmp_path: Path) -> None:
    stream = Terminal()
    console = RunConsole(tmp_path, total_steps=2, stream=stream, poll_s=3600, clock=lambda: 100.0)
    console.start()
    console.poll()
    assert stream.getvalue() == "running 0s | ETA ? | 2 steps"
    log_step(sink(tmp_path, "orchestrator"), sink(tmp_path, "trainer"), 0)
    console.stop()

    *_, line, status, end = stream.getvalue().split(CLEAR_LINE)
    step_line, redrawn = line.split("\n")
    assert step_line.startswith("step 0 (1/2) |") and redrawn.startswith("running 0s"), "the line goes above the status"
    assert status.startswith("running 0s") and end == "", "no status line is left behind"


def test_lines_of_printed_steps_read_again_after_a_resume_rewrite_are_not_kept() -> None:
    board = ProgressBoard(total_steps=10)
    orchestrator = {"process": "orchestrator", "time": 1000.0, "train/learnable/reward": 0.5}
    trainer = {"process": "trainer", "time": 1000.0, "trainer/step_time_s": 1.0}
    for step in range(3):
        board.feed({"step": step, **orchestrator})
        assert board.feed({"step": step, **trainer}) is not None
    for step in range(3):  # the whole file again, as after a trainer's or orchestrator's restart
        assert board.feed({"step": step, **orchestrator}) is None
        assert board.feed({"step": step, **trainer}) is None
    assert board._orchestrator == {}  # nothing held for steps already printed (a leak in a long run)


def test_the_step_line_names_failed_rollouts_by_outcome_summed_over_envs() -> None:
    board = ProgressBoard(total_steps=2, ends_with="orchestrator")
    counts = {"a": {"scored": 6, "infra_error": 1, "env_error": 0}, "b": {"infra_error": 2, "cancelled": 1}}
    record = {
        "step": 0,
        "process": "orchestrator",
        "time": time.time(),
        "train/error_rate": 0.25,
        "perf/step_time": 1.0,
    }
    record |= {f"train/{env}/outcome/{o}": float(n) for env, c in counts.items() for o, n in c.items()}
    line = board.feed(record)
    assert line is not None and "errors 25% (infra 3, cancelled 1) |" in line
    quiet = {"step": 1, "process": "orchestrator", "time": time.time(), "train/a/outcome/scored": 4.0}
    line = board.feed(quiet)
    assert line is not None and "errors" in line and "(" not in line.split("errors")[1], "nothing failed: no note"


def test_a_fired_check_is_printed_once_beside_the_step_lines_and_a_dominant_role_is_named(tmp_path: Path) -> None:
    stream = io.StringIO()
    console = RunConsole(tmp_path, total_steps=2, stream=stream)
    orchestrator, trainer = sink(tmp_path, "orchestrator"), sink(tmp_path, "trainer")
    orchestrator.log(0, {"train/learnable/reward": 0.5, "perf/rollout_s/model": 1.0, "perf/rollout_s/scoring": 9.0})
    trainer.log(0, {"trainer/wait_time_s": 3.0, "trainer/step_time_s": 0.5, "trainer/publish_time_s": 0.5})
    orchestrator.log_check(1, "zero_variance", "check: every group had equal rewards for 5 steps")
    console.poll()
    console.poll()
    lines = stream.getvalue().splitlines()
    assert "| bound: env scoring 68% |" in lines[0]  # 3 s of waiting x 9/10, of 4 s
    assert lines[1:] == ["warning: check: every group had equal rewards for 5 steps"]
