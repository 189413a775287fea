"""Warm programs (the verifiers adapter's harness runs): a fork of a warm interpreter runs a program
as a fresh `python program args...` would, and nothing it starts outlives its cancelled caller or
the pool. Real processes and unix sockets, this venv's interpreter, a program written here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from contextlib import suppress
from pathlib import Path

from envrl.runtime.warm.programs import WarmPrograms
from tests.support.env_servers import alive, children, wait_until

PROGRAM = """
import json, os, subprocess, sys, time

if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "echo":
        info = {"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "stdin": sys.stdin.read()}
        print(json.dumps(info))
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    if mode == "signal":
        os.kill(os.getpid(), 15)
    if mode == "lazy":  # a module imported only when the program runs, as httpx imports its transport
        print("colorsys" in sys.modules)
        import colorsys
    if mode == "hang":
        sleeper = subprocess.Popen(["sleep", "600"])
        with open(out + ".tmp", "w") as f:
            json.dump([os.getpid(), sleeper.pid], f)
        os.rename(out + ".tmp", out)
        time.sleep(600)
"""


def program(tmp_path: Path) -> str:
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    return str(path)


def warm_servers() -> list[int]:
    """This test process's children that run runtime/warm/server.py."""
    found = []
    for pid in children(os.getpid()):
        with suppress(FileNotFoundError):
            if b"warm/server.py" in Path(f"/proc/{pid}/cmdline").read_bytes() and alive(pid):
                found.append(pid)
    return found


def test_a_warm_run_gets_its_argv_environment_directory_and_output_and_its_exit_code(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {"PROBE": "here", "PATH": os.environ["PATH"]}

    async def main() -> list[tuple[int, str, str]]:
        pool = WarmPrograms()
        try:
            runs = [await pool.run(sys.executable, program(tmp_path), ["echo", "x", "a b"], env, workdir)]
            runs.append(await pool.run(sys.executable, program(tmp_path), ["signal", "x"], env, workdir))
            return [(r.exit_code, r.stdout, r.stderr) for r in runs]
        finally:
            await pool.aclose()

    (code, stdout, stderr), (killed, _, _) = asyncio.run(main())
    assert code == 3 and stderr == "to stderr\n"
    assert json.loads(stdout) == {"argv": ["echo", "x", "a b"], "cwd": str(workdir), "probe": "here", "stdin": ""}
    assert killed == -signal.SIGTERM  # as asyncio reports a child killed by a signal
    assert not warm_servers()


def test_a_module_a_run_imported_is_already_imported_in_the_next_runs(tmp_path: Path) -> None:
    async def main() -> list[str]:
        pool = WarmPrograms()
        try:
            runs = [await pool.run(sys.executable, program(tmp_path), ["lazy", "x"], {}, tmp_path) for _ in range(3)]
            return [run.stdout.strip() for run in runs]
        finally:
            await pool.aclose()

    assert asyncio.run(main()) == ["False", "True", "True"]


def test_a_cancelled_warm_run_is_killed_with_its_children_and_the_pool_stops_its_server(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"

    async def main() -> tuple[list[int], list[int]]:
        pool = WarmPrograms()
        try:
            run = asyncio.ensure_future(
                pool.run(sys.executable, program(tmp_path), ["hang", str(pids_file)], dict(os.environ), tmp_path)
            )
            await asyncio.to_thread(wait_until, pids_file.exists, 60, "the program started")
            servers = warm_servers()
            run.cancel()
            with suppress(asyncio.CancelledError):
                await run
            pids = json.loads(pids_file.read_text())
            await asyncio.to_thread(wait_until, lambda: not any(map(alive, pids)), 30, "the run and its child died")
            assert servers and all(map(alive, servers))  # the server stays for the next run
            return servers, pids
        finally:
            await pool.aclose()

    servers, _ = asyncio.run(main())
    assert not any(map(alive, servers))


def test_a_sigkilled_warm_server_takes_its_live_run_and_the_run_s_children_with_it(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"

    async def main() -> list[int]:
        pool = WarmPrograms()
        try:
            run = asyncio.ensure_future(
                pool.run(sys.executable, program(tmp_path), ["hang", str(pids_file)], dict(os.environ), tmp_path)
            )
            await asyncio.to_thread(wait_until, pids_file.exists, 60, "the program started")
            (server,) = warm_servers()
            os.kill(server, signal.SIGKILL)
            with suppress(RuntimeError):  # the server ended the run without an exit code
                await run
            return json.loads(pids_file.read_text())
        finally:
            await pool.aclose()

    pids = asyncio.run(main())
    try:
        wait_until(lambda: not any(map(alive, pids)), 10, f"the run and its child {pids} died with their server")
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


MODULE = """
import json, os, sys, time
from . import helper

if __name__ == "__main__":  # the warm server imports the module once: only the entry point is per run
    print(json.dumps({"name": __name__, "package": __package__, "path0": sys.path[0], "argv": sys.argv[1:], "helper": helper.X}), flush=True)
    print("on stderr", file=sys.stderr, flush=True)
    sys.stdout.flush()
    with open(os.environ["MARKER"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.environ["MARKER"] + ".tmp", os.environ["MARKER"])
    time.sleep(600)  # a server: runs until it is killed
"""


def test_a_module_runs_as_python_m_would_and_a_started_run_dies_when_killed(tmp_path: Path) -> None:
    package = tmp_path / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("X = 42\n")
    (package / "serve.py").write_text(MODULE)
    workdir, log, marker = tmp_path / "work", tmp_path / "server.log", tmp_path / "pid"
    workdir.mkdir()
    env = {"PYTHONPATH": str(tmp_path), "MARKER": str(marker), "PATH": os.environ["PATH"]}

    async def main() -> int:
        pool = WarmPrograms()
        try:
            run = await pool.start(sys.executable, "-m warmpkg.serve", ["--flag"], env, workdir, log, log)
            await asyncio.to_thread(wait_until, marker.exists, 30, "the module started")
            pid = int(marker.read_text())
            run.kill()
            await asyncio.to_thread(wait_until, lambda: not alive(pid), 10, "the killed run is gone")
            return pid
        finally:
            await pool.aclose()

    asyncio.run(main())
    first, second = log.read_text().splitlines()[:2]
    info = json.loads(first)
    assert info == {"name": "__main__", "package": "warmpkg", "path0": str(workdir), "argv": ["--flag"], "helper": 42}
    assert second == "on stderr"  # stdout and stderr share the one log, as `> LOG 2>&1`
    assert not warm_servers()
