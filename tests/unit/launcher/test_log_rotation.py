"""Logs rotate past their size limit without the writing process reopening anything."""

import subprocess
import sys
import time
from pathlib import Path

from envrl.launcher.log_rotation import LogRotationConfig, LogRotator, rotate_if_large, rotate_logs

MIB = 1024**2


def test_a_log_over_the_limit_is_copied_to_dot_1_and_emptied(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_bytes(b"a" * (MIB + 1))
    assert rotate_if_large(log, LogRotationConfig(max_mb=1, keep=2))
    assert log.stat().st_size == 0
    assert (tmp_path / "trainer.log.1").read_bytes() == b"a" * (MIB + 1)


def test_only_keep_copies_survive_and_the_newest_is_dot_1(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    config = LogRotationConfig(max_mb=0.001, keep=2)
    for fill in b"abc":
        log.write_bytes(bytes([fill]) * 2000)
        assert rotate_if_large(log, config)
    assert (tmp_path / "x.log.1").read_bytes()[:1] == b"c"
    assert (tmp_path / "x.log.2").read_bytes()[:1] == b"b"
    assert not (tmp_path / "x.log.3").exists()


def test_a_small_log_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"a" * 100)
    assert not rotate_if_large(log, LogRotationConfig(max_mb=1))
    assert not rotate_if_large(tmp_path / "missing.log", LogRotationConfig(max_mb=1))
    assert log.stat().st_size == 100


def test_a_child_appending_to_its_log_keeps_writing_into_the_same_file_after_rotation(tmp_path: Path) -> None:
    # The launcher opens children's logs for appending and never reopens them: after the
    # truncation the child's next write must land at the start of the emptied file, not at its
    # old offset (which would leave a hole as large as the rotated log).
    log = tmp_path / "envs" / "train" / "env.log"
    log.parent.mkdir(parents=True)
    code = "import sys\nfor line in sys.stdin:\n    print(line.strip() * 1000, flush=True)\n"
    with log.open("ab") as out:
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=out, text=True)
    assert child.stdin is not None
    child.stdin.write("a\n")
    child.stdin.flush()
    while log.stat().st_size < 1001:
        assert child.poll() is None, "the writer died before its first line"
        time.sleep(0.01)
    assert rotate_logs(tmp_path, LogRotationConfig(max_mb=0.0005)) == [log]
    child.stdin.write("b\n")
    child.stdin.close()
    child.wait()
    assert log.read_text() == "b" * 1000 + "\n"
    assert (log.parent / "env.log.1").read_text() == "a" * 1000 + "\n"


def test_the_rotator_stops_without_waiting_out_its_interval(tmp_path: Path) -> None:
    rotator = LogRotator(tmp_path, LogRotationConfig(), interval_s=3600).start()
    rotator.stop()  # would block for an hour if the wait were a sleep (pytest's timeout fails it)


def test_a_log_that_is_a_symlink_is_never_truncated(tmp_path: Path) -> None:
    # Code running as the run's user could plant logs/x.log -> a file envrl did not write.
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"p" * 5000)
    logs = tmp_path / "logs"
    (logs / "envs").mkdir(parents=True)
    (logs / "x.log").symlink_to(precious)
    (logs / "envs" / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert rotate_logs(logs, LogRotationConfig(max_mb=0.001)) == []
    assert precious.read_bytes() == b"p" * 5000

    (logs / "y.log").write_bytes(b"y" * 5000)  # a rotated copy's name planted as a link
    (logs / "y.log.1").symlink_to(precious)
    assert rotate_logs(logs, LogRotationConfig(max_mb=0.001, keep=1)) == [logs / "y.log"]
    assert precious.read_bytes() == b"p" * 5000
    assert (logs / "y.log.1").read_bytes() == b"y" * 5000 and not (logs / "y.log.1").is_symlink()


def test_a_directory_swapped_for_a_symlink_is_never_entered(tmp_path: Path) -> None:
    logs, elsewhere = tmp_path / "logs", tmp_path / "elsewhere"
    (logs / "envs").mkdir(parents=True)
    elsewhere.mkdir()
    victim = elsewhere / "x.log"
    victim.write_bytes(b"v" * 4096)
    (logs / "envs" / "x.log").write_bytes(b"l" * 4096)
    config = LogRotationConfig(max_mb=0.001)
    listed = logs / "envs" / "x.log"  # what a walk found, before the swap below
    (logs / "envs").rename(tmp_path / "old-envs")
    (logs / "envs").symlink_to(elsewhere)
    assert not rotate_if_large(listed, config, root=logs)
    assert rotate_logs(logs, config) == []
    assert victim.read_bytes() == b"v" * 4096 and sorted(p.name for p in elsewhere.iterdir()) == ["x.log"]


def test_a_rotated_copy_keeps_its_source_s_mode(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"x" * 4096)
    log.chmod(0o600)
    assert rotate_if_large(log, LogRotationConfig(max_mb=0.001))
    assert (tmp_path / "x.log.1").stat().st_mode & 0o777 == 0o600
