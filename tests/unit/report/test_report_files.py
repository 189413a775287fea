"""`envrl.report` on a small real run directory: the files a browser loads, without a browser."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from envrl.data.layout import batch_dir, eval_rollouts_file
from envrl.data.rollout_lines import append_lines, trace_line
from envrl.report.main import main, write_report
from envrl.report.page import STEP_FUNCTION
from envrl.report.plots import PLOTS
from tests.support.report_runs import (
    FAILED_LOG_TAIL,
    TINY_MODEL,
    samples_of,
    trace,
    write_config,
    write_eval_dir,
    write_failed_run,
    write_metrics,
    write_step,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def index_data(report: Path) -> dict:
    """The INDEX object the page's script reads (the template's one JSON literal)."""
    html = (report / "index.html").read_text()
    start = html.index("const INDEX = ") + len("const INDEX = ")
    return json.loads(html[start : html.index(";\n", start)].replace("<\\/", "</"))


def step_data(report: Path, step: int) -> dict:
    text = (report / "steps" / f"step_{step}.js").read_text()
    assert text.startswith(f"{STEP_FUNCTION}(") and text.endswith(");\n")
    return json.loads(text[len(STEP_FUNCTION) + 1 : -3])


def write_run(out: Path) -> Path:
    """A small finished run of 2 steps in `out`."""
    write_config(out)
    write_metrics(out, 2)
    write_step(out, 0, [trace(1, [300, 301, 2]), trace(1, error="timeout")], samples_of(trace(1, [300, 301, 2])))
    write_step(out, 1, [trace(2, [302, 2]), trace(3, [303, 2])], samples_of(trace(2, [302, 2])))
    return out


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of `write_run`'s run, written once for the tests that only read it."""
    return write_report(write_run(tmp_path_factory.mktemp("run")))


def test_report_has_every_plot_and_a_step_file_per_step(index: Path) -> None:
    report = index.parent

    html = index.read_text()
    for plot in PLOTS:
        assert (report / "plots" / f"{plot.name}.png").read_bytes().startswith(PNG_MAGIC)
        assert f"plots/{plot.name}.png" in html
    assert '"step":0' in html and '"step":1' in html
    assert "/*INDEX*/null" not in html


def test_step_file_holds_each_rollouts_tokens_masks_logprobs_and_errors(index: Path) -> None:
    report = index.parent
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)

    step0 = step_data(report, 0)
    [sample] = samples_of(trace(1, [300, 301, 2]))
    [good, failed] = step0["rollouts"]
    assert good["samples"][0]["ids"] == sample.input_ids
    assert good["samples"][0]["mask"] == sample.loss_mask == [0, 0, 1, 1, 1]
    assert good["samples"][0]["logprobs"] == [None, None, -0.25, -0.5, -0.75]
    assert good["reward"] == 0.5 and good["metrics"] == {"digit_fraction": 0.5}
    assert {int(k): v for k, v in step0["vocab"].items()} == {t: tokenizer.decode([t]) for t in sample.input_ids}
    assert failed["samples"] == [] and failed["error"]["type"] == "timeout" and failed["error"]["traceback"] == "tb"
    assert [len(r["samples"]) for r in step_data(report, 1)["rollouts"]] == [1, 0]


def test_unchanged_steps_are_not_written_again(run_dir: Path) -> None:
    report = write_report(run_dir).parent
    before = (report / "steps" / "step_0.js").stat().st_mtime_ns
    write_step(run_dir, 2, [trace(4, [304, 2])], samples_of(trace(4, [304, 2])))

    write_report(run_dir)

    assert (report / "steps" / "step_0.js").stat().st_mtime_ns == before
    assert step_data(report, 2)["rollouts"][0]["task"] == 4


def test_eval_rollouts_are_listed_with_their_step(run_dir: Path) -> None:
    evaluated = [trace(5, [305, 2], reward=1.0), trace(6, [306, 2], reward=0.0)]
    append_lines(
        eval_rollouts_file(run_dir, 2), (trace_line(t, step=2, env="learnable", policy_step=2) for t in evaluated)
    )

    report = write_report(run_dir).parent

    rollouts = step_data(report, 2)["rollouts"]
    assert [(r["split"], r["env"], r["task"], r["reward"], r["samples"]) for r in rollouts] == [
        ("eval", "learnable", 5, 1.0, []),
        ("eval", "learnable", 6, 0.0, []),
    ]
    assert '"step":2,"envs":{"learnable (eval)":2},"rollouts":0,"eval":2' in (report / "index.html").read_text()


def test_report_of_a_directory_that_is_no_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not a run directory" in capsys.readouterr().err


def test_headline_of_a_finished_run_names_model_envs_steps_and_final_weights(run_dir: Path) -> None:
    from envrl.launcher import summary

    summary.write(run_dir, [], summary.Outcome(status="success", reason="completed"), 3.0)
    headline = index_data(write_report(run_dir).parent)["headline"]
    assert headline["kind"] == "run" and headline["status"] == "success"
    assert headline["model"] == str(TINY_MODEL) and headline["envs"] == ["learnable"]
    assert headline["steps_done"] == 2 and headline["max_steps"] == 2 and headline["wall_time_s"] == 3.0
    assert "failure" not in headline


def test_a_failed_run_gets_a_failure_box_with_its_log_tail_and_no_empty_plots(tmp_path: Path) -> None:
    write_failed_run(tmp_path)
    report = write_report(tmp_path).parent
    index = index_data(report)
    failure = index["headline"]["failure"]
    assert failure["process"] == "trainer" and failure["exit_code"] == 1
    assert failure["log_tail"].endswith(FAILED_LOG_TAIL) and len(failure["log_tail"].splitlines()) == 40
    assert index["plots"] == [] and not (report / "plots").exists()


def test_an_eval_output_dir_gets_a_trace_browser_of_its_rollouts(tmp_path: Path) -> None:
    traces = write_eval_dir(tmp_path)
    report = write_report(tmp_path).parent
    index = index_data(report)
    assert index["headline"]["kind"] == "eval" and index["headline"]["envs"] == ["reverse-text"]
    assert index["headline"]["eval"]["reverse-text"]["reward"] == 0.5
    rollouts = step_data(report, 0)["rollouts"]
    assert [(r["split"], r["env"], r["reward"]) for r in rollouts] == [
        ("eval", "reverse-text", t.reward) for t in traces
    ]
    assert rollouts[2]["error"]["type"] == "ConnectError"


def test_a_step_whose_batch_retention_deleted_keeps_the_tokens_its_file_showed(run_dir: Path) -> None:
    report = write_report(run_dir).parent
    before = step_data(report, 0)
    assert any(r["samples"] for r in before["rollouts"])
    shutil.rmtree(batch_dir(run_dir, 0))
    write_report(run_dir)
    assert step_data(report, 0) == before


def test_model_text_in_the_page_holds_no_character_the_html_parser_acts_on(tmp_path: Path) -> None:
    """`<!--<script>` in a log line once kept the page's own `</script>` from ending its script
    (a blank page); the inlined data now carries `<`, `>` and `&` as JSON escapes only."""
    write_failed_run(tmp_path)
    hostile = "<!--<script> </script><img src=x onerror=alert(1)> & -->"
    with (tmp_path / "logs" / "trainer.log").open("a") as log:
        log.write(hostile + "\n")
    report = write_report(tmp_path).parent
    html = (report / "index.html").read_text()
    data = html[html.index("const INDEX = ") : html.index(";\n", html.index("const INDEX = "))]
    assert not {"<", ">", "&"} & set(data)
    assert index_data(report)["headline"]["failure"]["log_tail"].endswith(hostile)


def test_the_headline_and_rl_report_say_what_the_run_waits_for_and_which_checks_fired(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from envrl.telemetry.metrics import MetricsSink, WandbConfig
    from tests.support.pipeline_ledger import simulate, write_ledger

    shutil.rmtree(run_dir / "ledger", ignore_errors=True)
    write_ledger(run_dir, simulate(6, 1, gen=2.0, score=0.05, train=0.3))  # generation bounds
    sink = MetricsSink(run_dir / "metrics.jsonl", WandbConfig(), process="orchestrator", output_dir=run_dir)
    sink.log_check(1, "zero_variance", "check: every group had equal rewards")
    sink.close()
    main([str(run_dir)])
    headline = index_data(run_dir / "report")["headline"]
    assert headline["waiting_for"]["line"].startswith("change placement.inference.replicas: 1 -> 2 (expected 1.9")
    assert "shares: " in headline["waiting_for"]["text"]
    assert [c["message"] for c in headline["checks"]] == ["check: every group had equal rewards"]
    printed = capsys.readouterr().out
    assert "warning (step 1): check: every group had equal rewards" in printed
    assert "what the run waits for: change placement.inference.replicas: 1 -> 2" in printed
