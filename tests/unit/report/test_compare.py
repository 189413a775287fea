"""`rl report --compare`: several runs' reward curves, read from their metrics files alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envrl.data.layout import metrics_file
from envrl.report.compare import write_comparison
from envrl.report.main import main as report_main
from scripts.bench.trl_grpo_compare import write_trl_metrics


def _write_run(run: Path, lines: list[dict]) -> Path:
    run.mkdir(parents=True)
    metrics_file(run).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def _envrl_run(run: Path) -> Path:
    lines = [{"step": s, "process": "orchestrator", "train/letters/reward": 0.1 * s} for s in range(3)]
    lines += [{"step": s, "process": "trainer", "trainer/loss": 1.0} for s in range(3)]  # no reward: ignored
    lines.append({"step": 0, "process": "orchestrator", "eval/letters/reward": 0.25})
    lines.append({"step": 2, "process": "orchestrator", "eval/letters/reward": 0.5})
    return _write_run(run, lines)


def test_trl_curve_sits_beside_an_envrl_run_and_what_a_run_lacks_stays_blank(tmp_path: Path) -> None:
    envrl = _envrl_run(tmp_path / "envrl")
    write_trl_metrics(
        [{"step s": 20.0, "reward": 0.2}, {"step s": 21.0, "reward": 0.3}, {"step s": 19.0, "reward": 0.4, "x": 1.0}],
        "letters",
        tmp_path / "trl",
    )
    md = write_comparison([tmp_path / "trl", envrl], tmp_path / "cmp", ["TRL", "envrl"])
    text = md.read_text()
    train = text[text.index("## Train reward") : text.index("## Eval reward")]
    assert "| step | TRL | envrl |" in train
    assert "| 0 | 0.200 | 0.000 |" in train and "| 2 | 0.400 | 0.200 |" in train
    evals = text[text.index("## Eval reward") :]
    assert "| 0 |  | 0.250 |" in evals and "| 2 |  | 0.500 |" in evals  # TRL ran no eval: blank, not 0
    assert "| 1 |" not in evals  # a step nobody evaluated has no row
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(b"\x89PNG")
    trl_lines = [json.loads(line) for line in metrics_file(tmp_path / "trl").read_text().splitlines()]
    assert trl_lines[2] == {
        "step": 2,
        "process": "trl",
        "train/letters/reward": 0.4,
        "train/reward": 0.4,
        "trl/step s": 19.0,
        "trl/x": 1.0,
    }


def test_a_directory_without_metrics_and_unpaired_labels_are_refused(tmp_path: Path) -> None:
    envrl = _envrl_run(tmp_path / "envrl")
    with pytest.raises(FileNotFoundError, match="no metrics lines"):
        write_comparison([envrl, tmp_path / "typo"], tmp_path / "cmp")
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        write_comparison([envrl, envrl], tmp_path / "cmp", ["one"])
    assert not (tmp_path / "cmp").exists()


def test_cli_needs_one_mode_and_an_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    envrl = _envrl_run(tmp_path / "envrl")
    for argv in ([], [str(envrl), "--compare", str(envrl), "--out", "x"], ["--compare", str(envrl)]):
        with pytest.raises(SystemExit) as exit_info:
            report_main(argv)
        assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        report_main(["--compare", str(tmp_path / "missing"), "--out", str(tmp_path / "cmp")])
    assert exit_info.value.code == 2 and "no metrics lines" in capsys.readouterr().err
    report_main(["--compare", str(envrl), str(envrl), "--out", str(tmp_path / "cmp"), "--labels", "a", "b"])
    assert "| step | a | b |" in (tmp_path / "cmp" / "compare.md").read_text()
