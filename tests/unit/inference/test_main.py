"""`inference` as a command: config errors exit 2 with one line before vLLM is ever imported."""

import tomllib
from pathlib import Path

import pytest

from envrl.inference.main import main


def test_a_mistyped_key_exits_2_naming_the_closest_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--prot", "8001"])
    assert exit_info.value.code == 2
    assert "did you mean 'port'?" in capsys.readouterr().err


def test_dry_run_prints_the_resolved_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--port", "8123", "--output-dir", str(tmp_path), "--dry-run"])
    assert exit_info.value.code == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert (printed["port"], printed["output_dir"]) == (8123, str(tmp_path))
