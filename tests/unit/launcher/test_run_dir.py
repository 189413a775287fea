"""`rl`'s output dir: nothing rl did not write is reused or deleted, a failed start does not block
the retry, and a run resumes from its directory alone."""

import grp
import os
import pwd
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.run_dir import MARKER, prepare, user_config_file, write_user_config
from tests.support.other_user import as_nobody, needs_root, reachable_dir

ONE_ENV = ["--orchestrator.envs", '[{"id": "reverse-text"}]']


def config(out: Path, *flags: str) -> RLConfig:
    overrides = [("orchestrator.envs", '[{"id": "reverse-text"}]'), ("output-dir", str(out))]
    return resolve_config(RLConfig, overrides=[*overrides, *((flag, None) for flag in flags)])


def a_finished_run(out: Path) -> None:
    """What a run that trained leaves: its marker, a batch, a checkpoint, metrics and logs."""
    prepare(config(out))
    for path in ("rollouts/step_0", "checkpoints/step_1", "logs"):
        (out / path).mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')


def test_clean_never_deletes_a_directory_rl_did_not_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--output-dir", str(tmp_path), "--clean"])
    assert exit_info.value.code == 2
    assert f"holds files rl did not write (notes.txt; no {MARKER})" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_clean_removes_only_what_the_run_wrote(tmp_path: Path) -> None:
    a_finished_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    prepare(config(tmp_path, "clean"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "notes.txt"]


def test_clean_refuses_the_working_directory_and_its_ancestors(tmp_path: Path) -> None:
    a_finished_run(tmp_path)
    inside = tmp_path / "project"
    inside.mkdir()
    cwd = Path.cwd()
    try:
        os.chdir(inside)
        with pytest.raises(ConfigError, match="--clean refuses output_dir .* it is or holds"):
            prepare(config(tmp_path, "clean"))
    finally:
        os.chdir(cwd)
    assert (tmp_path / "metrics.jsonl").is_file() and inside.is_dir()


def test_clean_and_resume_together_are_refused_before_anything_is_deleted(tmp_path: Path) -> None:
    a_finished_run(tmp_path)
    with pytest.raises(ConfigError, match="--clean and --resume together"):
        prepare(config(tmp_path, "clean", "resume"))
    assert (tmp_path / "metrics.jsonl").is_file()


def test_a_failed_start_does_not_block_the_retry(tmp_path: Path) -> None:
    """A start that failed (busy port, bad model path) wrote configs and logs but published nothing."""
    prepare(config(tmp_path))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "trainer.toml").write_text("")
    (tmp_path / "logs").mkdir()
    prepare(config(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]


def test_an_earlier_run_needs_resume_or_clean(tmp_path: Path) -> None:
    a_finished_run(tmp_path)
    with pytest.raises(ConfigError, match="pass --resume to continue it or --clean to start over"):
        prepare(config(tmp_path))
    prepare(config(tmp_path, "resume"))
    assert (tmp_path / "metrics.jsonl").is_file()


def test_resume_needs_only_the_output_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = config(tmp_path).model_copy(update={"max_steps": 3, "seed": 11})
    write_user_config(stored)
    assert user_config_file(tmp_path).is_file()
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", "--output-dir", str(tmp_path), "--max-steps", "9", "--dry-run"])
    assert exit_info.value.code == 0
    orchestrator = capsys.readouterr().out.split("# orchestrator")[1].split("\n# ")[0]
    assert "max_steps = 9" in orchestrator and "seed = 11" in orchestrator and "resume = true" in orchestrator
    assert 'id = "reverse-text"' in orchestrator


def test_resume_without_a_stored_config_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"--resume without --config: {user_config_file(tmp_path)} not found" in capsys.readouterr().err


def test_another_user_cannot_read_the_run_directory() -> None:
    needs_root()
    with reachable_dir() as root:
        out = root / "run"
        prepare(config(out))
        write_user_config(config(out))
        assert out.stat().st_mode & 0o7777 == 0o700
        read = as_nobody(["cat", str(user_config_file(out))])
        assert read.returncode != 0 and "Permission denied" in read.stderr
        assert as_nobody(["ls", str(out)]).returncode != 0


def test_an_output_dir_group_may_read_the_run_and_nobody_else() -> None:
    needs_root()
    with reachable_dir() as root:
        out = root / "run"
        rl = config(out)
        rl.output_dir_group = "nogroup"
        prepare(rl)
        info = out.stat()
        assert info.st_mode & 0o7777 == 0o2750 and info.st_gid == grp.getgrnam("nogroup").gr_gid
        assert as_nobody(["ls", str(out)], group="nogroup").returncode == 0
        assert as_nobody(["ls", str(out)], group="daemon").returncode != 0


def test_an_output_dir_of_another_user_is_refused() -> None:
    needs_root()
    with reachable_dir() as root:
        out = root / "run"
        out.mkdir()
        os.chown(out, pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(ConfigError, match="belongs to uid"):
            prepare(config(out))
