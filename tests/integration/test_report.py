"""The report of the shared smoke run (written by `rl` at its end), opened in a real headless
chromium from file://: the plots load, and the trace browser lists the step's rollouts with the
masks and tokens of the batch files. The run's time ledger accounts for its steps' wall time and
its timeline.json is a trace-event file with a track per process. A failed run's report and an
`rl eval` dir's report (built from files, no vLLM) open with their headline and failure box.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import pytest
from matplotlib.image import imread

from envrl.data.layout import (
    batch_dir,
    eval_results_file,
    eval_rollouts_file,
    logs_dir,
    published_steps,
    report_dir,
    rollouts_root,
    train_rollouts_file,
)
from envrl.data.rollout_lines import append_lines, trace_line
from envrl.data.samples import read_batch
from envrl.report.main import write_report
from envrl.report.plots import PLOTS
from envrl.report.timeline import step_splits
from envrl.telemetry.ledger import read_ledger
from tests.support.report_runs import (
    FAILED_LOG_TAIL,
    samples_of,
    trace,
    write_config,
    write_eval_dir,
    write_failed_run,
    write_metrics,
    write_step,
)
from tests.support.smoke import FinishedRun

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs chromium (apt-get install -y chromium; .ci/run does)"
)


def chromium(tmp_path: Path, url: str, *flags: str) -> str:
    """Run headless chromium on `url` until its scripts settle; its stdout."""
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000", "--window-size=1400,2400", *flags, url,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dom_of_report(tmp_path: Path, output_dir: Path) -> str:
    """Write the report of `output_dir` and open it in chromium; the page's DOM after its scripts ran."""
    return unescape(chromium(tmp_path, write_report(output_dir).resolve().as_uri(), "--dump-dom"))


def page(smoke_run: FinishedRun, step: int, rollout: int) -> str:
    return f"{(smoke_run.out / 'report' / 'index.html').resolve().as_uri()}#step={step}&rollout={rollout}"


def rollout_lines(out: Path, step: int) -> int:
    return sum(f'"step": {step},' in line for line in train_rollouts_file(out).read_text().splitlines())


@needs_chromium
def test_trace_browser_lists_the_steps_rollouts_with_the_batch_masks(smoke_run: FinishedRun, tmp_path: Path) -> None:
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    # A kept step whose every rollout became one sample: then rollout i is the batch's sample i.
    kept = reversed(published_steps(rollouts_root(smoke_run.out)))
    step = next(s for s in kept if len(read_batch(batch_dir(smoke_run.out, s))) == rollout_lines(smoke_run.out, s))
    samples = read_batch(batch_dir(smoke_run.out, step))
    for rollout in (0, len(samples) - 1):
        dom = chromium(tmp_path, page(smoke_run, step, rollout), "--dump-dom")

        for plot in PLOTS:
            img = re.search(rf'<img src="plots/{plot.name}.png"[^>]*>', dom)
            assert img and re.search(r'data-loaded="[1-9]\d*"', img.group(0)), f"plot {plot.name} did not load"
        assert len(re.findall(r'<tr class="rollout train', dom)) == len(samples)
        detail = re.search(rf'<div id="rollout-detail" data-step="{step}" data-index="{rollout}">.*', dom, re.S)
        assert detail, f"the page did not show rollout {rollout} of step {step}"
        tokens = re.findall(r'<span class="tok (?:trained|masked)" data-mask="(\d)" title="id (\d+)', detail.group(0))
        assert [int(m) for m, _ in tokens] == samples[rollout].loss_mask
        assert [int(i) for _, i in tokens] == samples[rollout].input_ids
        assert "messages" in unescape(detail.group(0))


@needs_chromium
def test_a_failed_runs_report_opens_with_the_failure_box_not_empty_plots(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_failed_run(run)
    dom = dom_of_report(tmp_path, run)
    headline = re.search(r'<table id="headline">(.*?)</table>', dom, re.S)
    assert headline and '<span class="status-failed">failed</span>' in headline.group(1)
    assert "<td>0 of 2</td>" in headline.group(1) and "<td>13 s</td>" in headline.group(1)
    failure = re.search(r'<div id="failure">(.*?)</div>', dom, re.S)
    assert failure, "no visible failure box"
    assert "The run failed: trainer with exit code 1" in failure.group(1)
    assert failure.group(1).rstrip().endswith(f"{FAILED_LOG_TAIL}</pre>")
    assert "<img" not in dom and "no plots: the run wrote no metrics line" in dom


HOSTILE_TEXT = (
    '<!--<script> </script><img src=x onerror="document.body.dataset.pwned=1">'
    "<script>document.body.dataset.pwned=2</script>"
)
"""Text a model can place in a log line or a completion: an HTML comment opener that would make
the page's own `</script>` not end its script, and markup that would run if parsed as HTML."""


@needs_chromium
def test_model_text_in_logs_and_completions_is_shown_as_text_and_never_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_failed_run(run)
    with (logs_dir(run) / "trainer.log").open("a") as log:
        log.write(f"the last completion was {HOSTILE_TEXT}\n")
    dom = dom_of_report(tmp_path, run)
    assert "data-pwned" not in dom, "the page ran model text"
    failure = re.search(r'<div id="failure">(.*?)</div>', dom, re.S)
    assert failure, "the failure box is missing: model text in the log broke the page's script"
    assert failure.group(1).rstrip().endswith(f"the last completion was {HOSTILE_TEXT}</pre>")

    out = tmp_path / "eval"
    hostile = trace(1, [300, 2], reward=1.0)
    hostile.branches[0].turns[0].response["content"] = HOSTILE_TEXT
    append_lines(eval_results_file(out, "reverse-text"), [trace_line(hostile, env="reverse-text", rollout=0)])
    dom = chromium(tmp_path, write_report(out).resolve().as_uri() + "#rollout=0", "--dump-dom")
    assert "data-pwned" not in dom, "the page ran model text"
    assert HOSTILE_TEXT in unescape(re.search(r'<div id="rollout-detail".*', dom, re.S).group(0))


@needs_chromium
def test_an_evals_report_lists_its_rollouts_under_the_eval_headline(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    traces = write_eval_dir(out)
    dom = dom_of_report(tmp_path, out)
    headline = re.search(r'<table id="headline">(.*?)</table>', dom, re.S)
    assert headline and "<th>eval of</th><td>reverse-text</td>" in headline.group(1)
    assert "reward 0.500, error_rate 0.333" in headline.group(1)
    assert '<div id="failure" hidden="">' in dom
    assert len(re.findall(r'<tr class="rollout eval', dom)) == len(traces)
    assert "ConnectError" in dom


@needs_chromium
def test_the_trace_browser_opens_on_the_last_train_step_not_the_final_evals(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_config(run)
    write_metrics(run, 2)
    for step in (0, 1):
        write_step(run, step, [trace(step, [300, 2]), trace(step, [301, 2])], samples_of(trace(step, [300, 2])))
    final_eval = (trace_line(trace(9, [302, 2]), step=2, env="learnable-eval", policy_step=2),)
    append_lines(eval_rollouts_file(run, 2), final_eval)  # the eval at max_steps: a step of its own
    dom = dom_of_report(tmp_path, run)
    assert '<span id="status" class="muted">2 rollouts at step 1</span>' in dom
    assert len(re.findall(r'<tr class="rollout train', dom)) == 2


@needs_chromium
def test_screenshot_shows_the_plots(smoke_run: FinishedRun, tmp_path: Path) -> None:
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    shot = tmp_path / "report.png"
    chromium(tmp_path, page(smoke_run, 39, 0), f"--screenshot={shot}")

    pixels = imread(shot)[:, :, :3]
    # matplotlib's first line colour (C0, #1f77b4) is nowhere on the page but in the plots
    blue = (abs(pixels[:, :, 0] - 0x1F / 255) < 0.05) & (abs(pixels[:, :, 1] - 0x77 / 255) < 0.05)
    blue &= abs(pixels[:, :, 2] - 0xB4 / 255) < 0.05
    assert blue.sum() > 2000, f"only {blue.sum()} plot-blue pixels: the plots are not on the screenshot"


def test_the_ledger_records_every_steps_work_in_causal_order(smoke_run: FinishedRun) -> None:
    """What the ledger must hold whatever the load: every step's trainer work in order, after the
    batch it reads was published, with the step's parts summing to its wall time. How much of a
    step the spans explain depends on how busy the machine is, so that share is printed by
    `scripts/bench/e2e.py`, not asserted here."""
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    spans = read_ledger(smoke_run.out)
    splits = step_splits(spans)
    assert [split.step for split in splits] == list(range(40))
    for split in splits:
        # The parts are differences of time.time() stamps near 1.8e9 s (ulp 2.4e-7 s); a step has far
        # fewer than 1,000 cuts, so their float sum is within 1e-3 s of the wall time.
        assert sum(split.parts.values()) == pytest.approx(split.wall, abs=1e-3), split
    # The batch file appears inside `publish_batch`, so no read can start before that span did.
    publishing = {s.step: s.start for s in spans if s.process == "orchestrator" and s.name == "publish_batch"}
    for step in range(40):
        mine = {s.name: s for s in spans if s.process == "trainer" and s.step == step}
        order = [mine[name] for name in ("wait_batch", "read_batch", "compute", "publish")]
        assert all(a.end <= b.start for a, b in zip(order, order[1:], strict=False)), (step, order)
        assert publishing[step] <= mine["read_batch"].start, f"step {step} read before it was published"


def test_timeline_json_is_trace_events_with_a_track_per_process(smoke_run: FinishedRun) -> None:
    assert smoke_run.code == 0, smoke_run.console[-3000:]
    events = json.loads((report_dir(smoke_run.out) / "timeline.json").read_text())["traceEvents"]
    tracks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(tracks.values()) == ["env learnable", "inference", "orchestrator", "trainer"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(tracks)
    for e in spans:
        assert isinstance(e["name"], str) and e["tid"] >= 1 and e["ts"] >= 0 and e["dur"] >= 0, e
    trained = {e["args"]["step"] for e in spans if tracks[e["pid"]] == "trainer" and e["name"] == "compute"}
    assert trained == set(range(40))
