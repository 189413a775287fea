"""Escape attempts from a bubblewrap sandbox, each a real attempt by the code inside, each contained.

After each attempt the sandbox (or a fresh one) still serves, and when it is closed no process
of it is alive (each sandbox runs under a host uid of its own, so its processes are easy to count).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from envrl.sandbox import (
    BubblewrapProvider,
    Limits,
    Sandbox,
    SandboxConfig,
    SandboxProtocolError,
    SandboxStartError,
    reaper,
)
from tests.support.sandbox_attacks import answer, forge_program
from tests.support.sandboxes import host_temp_dir, processes_of, run_dir, wait_gone

__all__ = ["run_dir"]

DAEMON = "python3 -c 'import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0:\n  time.sleep(600)\n'"
"""Starts a double-forked, setsid daemon that sleeps 10 minutes."""


async def _python(box: Sandbox, code: str, timeout: float = 10.0):
    await box.write_file("attempt.py", textwrap.dedent(code))
    return await box.run(["python3", "attempt.py"], timeout=timeout)


def _contained(config: SandboxConfig, attempt) -> None:
    """Run `attempt(box)` in a fresh sandbox; then it still answers, and closing it leaves nothing."""

    async def main() -> None:
        box = await BubblewrapProvider().create(config)
        try:
            await attempt(box)
            assert (await box.run("echo alive")).stdout == "alive\n"
        finally:
            await box.close()
        assert wait_gone(box.uid) == []

    asyncio.run(main())


def test_secrets_of_the_parent_environment_and_home_are_not_readable(run_dir: Path) -> None:
    secret = f"envrl-secret-{uuid.uuid4().hex}"
    home_file = Path.home() / f".envrl-sandbox-secret-{uuid.uuid4().hex}"
    home_file.write_text(secret)
    os.environ["ENVRL_TEST_SECRET"] = secret

    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            f"""
            import glob, os
            seen = [repr(dict(os.environ))]
            for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + [{str(home_file)!r}]:
                try:
                    seen.append(open(path, "rb").read().decode(errors="replace"))
                except OSError as e:
                    seen.append(type(e).__name__)
            print("\\n".join(seen))
        """,
        )
        assert result.exit_code == 0
        assert secret not in result.stdout + result.stderr
        assert "FileNotFoundError" in result.stdout  # the home file is not in the sandbox at all

    try:
        _contained(SandboxConfig(), attempt)
    finally:
        del os.environ["ENVRL_TEST_SECRET"]
        home_file.unlink()


def test_tcp_connections_out_fail_and_reach_nothing() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]

    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            f"""
            import socket
            for host in ("127.0.0.1", "1.1.1.1", "8.8.8.8"):
                try:
                    socket.create_connection((host, {port} if host == "127.0.0.1" else 53), timeout=2)
                    print("CONNECTED", host)
                except OSError as e:
                    print("BLOCKED", host, e)
        """,
        )
        assert result.stdout.count("BLOCKED") == 3, result

    try:
        _contained(SandboxConfig(), attempt)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_the_worker_ipc_socket_cannot_be_reached(tmp_path: Path) -> None:
    path_dir = host_temp_dir(tmp_path)
    path_socket = socket.socket(socket.AF_UNIX)
    path_socket.bind(str(path_dir / "worker.ipc"))
    path_socket.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"envrl-test-{uuid.uuid4().hex}"
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    for s in (path_socket, abstract):
        s.settimeout(0.3)

    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            f"""
            import socket
            for address in ({str(path_dir / "worker.ipc")!r}, "\\0{abstract_name}"):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(address)
                    s.sendall(b"forged reward")
                    print("CONNECTED")
                except OSError as e:
                    print("BLOCKED", type(e).__name__)
        """,
        )
        assert result.stdout.count("BLOCKED") == 2, result

    try:
        _contained(SandboxConfig(image=[Path("/usr"), path_dir]), attempt)
        for s in (path_socket, abstract):
            with pytest.raises(TimeoutError):
                s.accept()
    finally:
        path_socket.close()
        abstract.close()
        shutil.rmtree(path_dir)


def test_nothing_outside_the_sandbox_can_be_written(tmp_path: Path) -> None:
    image = host_temp_dir(tmp_path)
    (image / "data.txt").write_text("original")
    (image / "data.txt").chmod(0o666)

    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            f"""
            import os
            targets = [{str(image / "data.txt")!r}, {str(image / "new.txt")!r}, "/usr/envrl-escape",
                       "/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/etc/passwd", "/root/escape"]
            for path in targets:
                try:
                    with open(path, "w") as f:
                        f.write("escaped")
                    print("WROTE", path)
                except OSError as e:
                    print("BLOCKED", path, type(e).__name__)
        """,
        )
        assert result.stdout.count("BLOCKED") == 7, result.stdout

    try:
        _contained(SandboxConfig(image=[Path("/usr"), image]), attempt)
        assert (image / "data.txt").read_text() == "original"
        assert sorted(p.name for p in image.iterdir()) == ["data.txt"]
        assert not Path("/usr/envrl-escape").exists()
    finally:
        shutil.rmtree(image)


def test_a_fork_bomb_hits_the_process_limit_and_is_killed() -> None:
    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            """
            import os, time
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
        """,
            timeout=3,
        )
        assert result.timed_out
        assert len(processes_of(box.uid)) <= 4  # init, agent (+ bubblewrap): the bomb is gone

    _contained(SandboxConfig(limits=Limits(nproc=32)), attempt)
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


def test_a_memory_bomb_fails_inside_the_memory_limit() -> None:
    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            """
            chunks = []
            while True:
                chunks.append(bytearray(64 << 20))
        """,
        )
        assert result.exit_code != 0 and result.limit == "memory", result

    _contained(SandboxConfig(limits=Limits(memory_mib=256)), attempt)


def test_filling_the_disk_stops_at_the_sandbox_tmpfs() -> None:
    host_free = shutil.disk_usage("/tmp").free

    async def attempt(box: Sandbox) -> None:
        filled = await _python(
            box,
            """
            import os
            for i in range(1000):
                with open(f"fill{i}", "wb") as f:
                    f.write(os.urandom(8 << 20))
        """,
        )
        assert filled.limit == "disk", filled
        big = await box.run("head -c 100000000 /dev/zero > /work/one_big_file")
        assert big.limit in ("file_size", "disk"), big

    _contained(SandboxConfig(limits=Limits(disk_mib=32, file_mib=16)), attempt)
    assert shutil.disk_usage("/tmp").free > host_free - (256 << 20)


def test_the_owner_cannot_be_killed_or_traced_and_neither_can_the_agent() -> None:
    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            f"""
            import ctypes, os, signal
            libc = ctypes.CDLL(None, use_errno=True)
            for pid in ({os.getpid()}, {os.getppid()}, 1):
                try:
                    os.kill(pid, signal.SIGKILL if pid != 1 else 0)
                    print("signalled", pid)
                except OSError as e:
                    print("kill denied", pid, type(e).__name__)
            agent = os.getppid()
            print("ptrace agent", libc.ptrace(16, agent, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
            try:
                os.listdir(f"/proc/{{agent}}/fd")
                print("agent fds readable")
            except OSError as e:
                print("agent fds denied", type(e).__name__)
        """,
        )
        assert "signalled" not in result.stdout.replace("signalled 1\n", ""), result.stdout
        assert "ptrace agent -1" in result.stdout, result.stdout
        assert "agent fds denied" in result.stdout, result.stdout

    _contained(SandboxConfig(), attempt)  # and we are still here


def test_a_daemon_does_not_outlive_the_episode() -> None:
    async def main() -> None:
        async with await BubblewrapProvider().create(SandboxConfig()) as box:
            await box.run(DAEMON)
            assert len(processes_of(box.uid)) >= 3
        assert wait_gone(box.uid) == []

    asyncio.run(main())


def test_a_daemon_does_not_outlive_a_command_timeout() -> None:
    async def main() -> None:
        async with await BubblewrapProvider().create(SandboxConfig()) as box:
            result = await box.run(f"{DAEMON}; sleep 30", timeout=1)
            assert result.timed_out
            ps = await box.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            assert "time.sleep(600)" not in ps.stdout, ps  # the daemon is gone before the episode ends
        assert wait_gone(box.uid) == []

    asyncio.run(main())


OWNER = """
import asyncio, sys
from envrl.sandbox import BubblewrapProvider, SandboxConfig
async def main():
    box = await BubblewrapProvider().create(SandboxConfig())
    await box.run(sys.argv[1])
    print(box.uid, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_daemon_does_not_outlive_a_sigkilled_owner_and_the_reaper_clears_its_record(run_dir: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, DAEMON], stdout=subprocess.PIPE, text=True)
    try:
        uid = int(owner.stdout.readline())
        assert len(processes_of(uid)) >= 3
        assert len(list(run_dir.glob("*.json"))) == 1
        owner.kill()
        owner.wait()
        assert wait_gone(uid) == []
        reaper.reap()
        assert list(run_dir.glob("*.json")) == []
    finally:
        owner.kill()
        owner.wait()


def test_the_reaper_kills_every_process_of_a_sandbox_whose_owner_is_gone_and_no_other(run_dir: Path) -> None:
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    orphan_uid, kept_uid = 1_999_000_001, 1_999_000_002
    orphan = subprocess.Popen(["sleep", "600"], user=orphan_uid, group=orphan_uid, start_new_session=True)
    kept = subprocess.Popen(["sleep", "600"], user=kept_uid, group=kept_uid)
    try:
        record = reaper.Record(uid=orphan_uid, owner=dead_owner.pid, owner_start=1)
        record.path.write_text(json.dumps(dataclasses.asdict(record)))
        ours = reaper.claim(kept_uid)  # owned by this (live) process: left alone
        assert ours is not None and reaper.claim(kept_uid) is None  # one live sandbox per uid
        assert [r.uid for r in reaper.reap()] == [orphan_uid]
        assert orphan.wait(5) == -9 and kept.poll() is None
        assert ours.path.exists() and not record.path.exists()
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the forgery sets x86_64 registers")
def test_a_ptrace_forgery_of_later_answers_is_denied_and_every_answer_stays_genuine() -> None:
    """Issue 37: code attaches pid 1 (bubblewrap's init) and every other process it sees, makes
    each write forged answer frames to its pipes, and detaches; on the old code the host took
    them as the answers to this command and the next."""

    async def attempt(box: Sandbox) -> None:
        await box.write_file("attack.py", forge_program([answer("forged 1\n"), answer("forged 2\n")]))
        result = await box.run(["python3", "attack.py"])
        assert "forged" not in result.stdout, result
        report = json.loads(result.stdout)
        assert report and all("denied" in r and "Errno 1]" in r["denied"] for r in report.values()), report
        assert (await box.run("echo genuine")).stdout == "genuine\n"

    _contained(SandboxConfig(), attempt)


def test_bubblewraps_pid_1_holds_no_pipe_of_the_protocol() -> None:
    """Whatever code could make pid 1 (bubblewrap's init, dumpable, the sandbox's uid) do, it
    cannot answer for the agent: its stdin and stdout are /dev/null (on the old code they were
    the host's request and answer pipes, which the ptrace forgery wrote to)."""

    async def attempt(box: Sandbox) -> None:
        result = await _python(
            box,
            """
            import json, os
            print(json.dumps({fd: os.readlink(f"/proc/1/fd/{fd}") for fd in os.listdir("/proc/1/fd")}))
        """,
        )
        held = json.loads(result.stdout)
        assert held["0"] == held["1"] == "/dev/null", held

    _contained(SandboxConfig(), attempt)


def _unreaped(uid: int) -> bool:
    """Whether a process of `uid`, zombies included, is still in /proc."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if f"\nUid:\t{uid}\t" in status.read_text():
                return True
    return False


def test_a_process_already_running_as_a_sandbox_uid_survives_and_the_sandbox_takes_another(run_dir: Path) -> None:
    """Issue 37: closing a sandbox kills every process of its uid; the old code claimed a uid
    without looking, and a process already running as it died with the sandbox."""
    busy = 1_999_100_010
    neighbour = subprocess.Popen(["setpriv", f"--reuid={busy}", f"--regid={busy}", "--clear-groups", "sleep", "600"])
    try:
        while not processes_of(busy):
            assert neighbour.poll() is None
        config = SandboxConfig(host_uids=(busy, busy + 2))

        async def main() -> None:
            for _ in range(3):
                async with await BubblewrapProvider().create(config) as box:
                    assert box.uid == busy + 1
                    assert (await box.run("echo alive")).stdout == "alive\n"
                assert wait_gone(busy + 1) == []
                while _unreaped(busy + 1):  # the kernel counts them until the host's init reaps them
                    await asyncio.sleep(0.01)
            with pytest.raises(SandboxStartError, match=f"{busy}: processes run as it"):
                await BubblewrapProvider().create(SandboxConfig(host_uids=(busy, busy + 1)))

        asyncio.run(main())
        assert neighbour.poll() is None and processes_of(busy) == [neighbour.pid]
    finally:
        neighbour.kill()
        neighbour.wait()


def test_planted_state_directories_fall_back_to_private_ones_and_sandboxes_still_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: another user creates the predictable per-uid directories first; the old code
    refused them (good) and then every sandbox on the node failed with a PermissionError."""
    temp = Path(tempfile.mkdtemp(prefix="e37-", dir="/var/tmp"))  # short: the bridge's socket path must fit
    temp.chmod(0o755)
    planted = [temp / f"envrl-sandboxes-{os.getuid()}", temp / f"envrl-bridges-{os.getuid()}"]
    for path in planted:
        path.mkdir(mode=0o777)
        os.chown(path, 65534, 65534)
    monkeypatch.delenv(reaper.RUN_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    async def main() -> None:
        async with await BubblewrapProvider().create(SandboxConfig()) as box:
            await box.forward_host_ports([port])  # through the bridge directory
            code = f"import socket; socket.create_connection(('127.0.0.1', {port})).sendall(b'hi')"
            assert (await box.run(["python3", "-c", code])).exit_code == 0

    try:
        asyncio.run(main())
        listener.settimeout(5)
        assert listener.accept()[0].recv(2) == b"hi"
        assert all(list(path.iterdir()) == [] for path in planted)  # neither used nor touched
        assert sorted(p.name.rsplit("-", 1)[0] for p in temp.iterdir() if p not in planted) == sorted(
            p.name for p in planted
        )  # the private ones beside them
    finally:
        listener.close()
        shutil.rmtree(temp)


def test_an_answer_frame_the_host_did_not_ask_for_is_a_typed_error_never_a_result() -> None:
    """The third line of defence, on its own: a frame put on the answer pipe by someone other than
    the agent (here root on the host, through the agent's fd; code in the sandbox can no longer
    reach it) cannot echo the request's nonce, so the call raises `SandboxProtocolError` and the
    sandbox is killed: the forged stdout is never a result."""

    async def main() -> None:
        box = await BubblewrapProvider().create(SandboxConfig())
        try:
            agents = [p for p in processes_of(box.uid) if Path(f"/proc/{p}/cmdline").read_bytes().endswith(b"\0")]
            argv = Path(f"/proc/{agents[-1]}/cmdline").read_bytes().split(b"\0")
            answers_fd = int(argv[-2])  # the agent's argv ends with its request and answer fds
            forged = json.dumps({**answer("forged\n"), "seq": 1, "nonce": "0" * 32}).encode()
            with open(f"/proc/{agents[-1]}/fd/{answers_fd}", "wb", buffering=0) as pipe:
                pipe.write(len(forged).to_bytes(4, "big") + forged)
            with pytest.raises(SandboxProtocolError, match="did not echo request 1's nonce") as raised:
                await box.run("echo genuine")
            assert raised.value.error_type == "sandbox_protocol" and not box.alive
        finally:
            await box.close()
        assert wait_gone(box.uid) == []

    asyncio.run(main())
