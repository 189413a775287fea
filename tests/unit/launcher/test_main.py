"""`rl` as a command: subcommands dispatch, and a run's config problems stop it before anything starts."""

import importlib
from pathlib import Path

import pytest

from envrl.launcher.main import COMMANDS, main

ONE_ENV = ["--orchestrator.envs", '[{"id": "reverse-text"}]']


def test_rl_eval_runs_the_eval_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    assert "--num-examples, -n" in capsys.readouterr().out


def test_every_command_names_a_module_with_a_main() -> None:
    for name, module in COMMANDS.items():
        assert callable(importlib.import_module(module).main), name


def test_an_unknown_command_exits_2_naming_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["evl", "--env.id", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'evl'" in err and "did you mean 'rl eval'?" in err


def test_rl_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--orchestrator.batch-size" in out and "rl eval --help" in out


def test_dry_run_prints_every_process_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--dry-run"])
    assert exit_info.value.code == 0
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# ")]
    assert headers[:-1] == ["# inference", "# trainer", "# orchestrator", "# envs/train/reverse-text"]
    assert headers[-1].startswith("# cpus: ")  # the cores each compute process gets here


def test_an_earlier_run_in_output_dir_needs_resume_or_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "pass --resume to continue it or --clean to start over" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"
