"""`inference` as a command: config errors exit 2 with one line before vLLM is ever imported."""

import socket
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


def test_a_busy_port_exits_2_before_vllm_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: vLLM loaded for seconds, then uvicorn died with a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            main(["--port", str(port), "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"port 127.0.0.1:{port} is already in use" in capsys.readouterr().err
    assert not (tmp_path / "inference").exists(), "nothing of vLLM was set up"
