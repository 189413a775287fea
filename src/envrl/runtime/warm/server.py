"""A warm interpreter for one program: each run is a fork executing the program's unchanged source as `__main__`, killed
with its group when its connection or this server goes. Usage: `PYTHON server.py PROGRAM SOCKET` (stdlib only)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import random
import selectors
import shutil
import signal
import socket
import sys
import threading
import traceback
import types
from typing import TypedDict

_PR_SET_PDEATHSIG = 1
REPORT_AFTER_S = 1.0
"""When a run that is still running reports the modules it imported lazily."""
READY = "warm-program-ready"
"""The line the server prints on stdout once it listens."""


class RunRequest(TypedDict):
    """One run, a JSON line on a new connection; the answers are lines too: the run's pid, then
    its exit code (or one `error: ...` line for a request that could not be read)."""

    args: list[str]
    env: dict[str, str]
    cwd: str
    stdout: str
    """A file the run's stdout goes to (created or truncated)."""
    stderr: str


_pool_dir = "."
"""The socket's directory (set by `main`): the runs' output files and lists of imported modules."""


class Program:
    """What each run executes, loaded once: a file (`python FILE`) or a module (`python -m NAME`)."""

    def __init__(self, spec: str) -> None:
        self.module = spec[3:] if spec.startswith("-m ") else None
        if self.module is None:
            self.path = os.path.abspath(spec)
            sys.path[0] = os.path.dirname(self.path)  # as `python FILE` has it (not this server's directory)
            with open(spec, encoding="utf-8") as f:
                self.code = compile(f.read(), spec, "exec")
            # The program's imports, done once; its `if __name__ == "__main__"` entry point stays inert.
            exec(self.code, self.main("__envrl_warm__").__dict__)
            return
        sys.path[0] = os.getcwd()
        self.spec = importlib.util.find_spec(self.module)
        if self.spec is None or self.spec.origin is None or self.spec.loader is None:
            raise ModuleNotFoundError(f"no module named {self.module!r} (to run as -m)")
        importlib.import_module(self.module)  # its imports and definitions, once
        self.path = self.spec.origin
        self.code = self.spec.loader.get_code(self.module)  # type: ignore[attr-defined]

    def main(self, name: str = "__main__") -> types.ModuleType:
        module = types.ModuleType(name)
        module.__file__ = self.path
        if self.module is not None:
            module.__package__ = self.module.rpartition(".")[0]
            module.__spec__ = self.spec
            module.__loader__ = self.spec.loader
        sys.modules[name] = module
        return module

    def enter(self, cwd: str) -> None:
        """In a run: `sys.path[0]` as the interpreter would have set it."""
        if self.module is not None:
            sys.path[0] = cwd


def main(spec: str, address: str) -> None:
    global _pool_dir
    _pool_dir = os.path.dirname(os.path.abspath(address))
    program = Program(spec)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(128)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, ("accept", 0))
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, ("parent", 0))
    runs: dict[int, socket.socket | None] = {}
    """Live runs: pid -> the connection that waits for its exit code (None once it closed)."""
    print(READY, flush=True)
    while True:
        for key, _ in selector.select():
            kind, pid = key.data
            if kind == "parent" and not os.read(sys.stdin.fileno(), 4096):
                for live in runs:
                    _kill(live)
                shutil.rmtree(_pool_dir, ignore_errors=True)  # a parent killed outright cannot
                return
            if kind == "accept":
                conn, _ = listener.accept()
                pid = _start(conn, program)
                if pid:
                    runs[pid] = conn
                    selector.register(conn, selectors.EVENT_READ, ("conn", pid))
                    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, ("exit", pid))
            elif kind == "conn" and pid in runs:  # the caller went away (a cancelled rollout): stop the run
                _kill(pid)
                selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                runs[pid] = None
            elif kind == "exit":
                _, status = os.waitpid(pid, 0)
                _learn_imports(pid)
                selector.unregister(key.fd)
                os.close(key.fd)
                if (conn := runs.pop(pid)) is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                    selector.unregister(conn)
                    conn.close()


def _start(conn: socket.socket, program: Program) -> int:
    """Fork a run for the request on `conn` and answer its pid; 0 (conn closed) for a bad request."""
    conn.settimeout(30.0)
    try:
        with conn.makefile("rb") as lines:
            request: RunRequest = json.loads(lines.readline())
    except (OSError, ValueError) as e:
        with contextlib.suppress(OSError):
            conn.sendall(f"error: unreadable run request: {type(e).__name__}: {e}\n".encode())
        conn.close()
        return 0
    conn.settimeout(None)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        _run(request, program, server)
    with contextlib.suppress(OSError):  # a caller already gone is noticed by the selector: the run is killed
        conn.sendall(f"{pid}\n".encode())
    return pid


def _die_with_server(server: int) -> None:
    """SIGKILL this run when the server dies, even by SIGKILL (Linux's parent-death signal)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:  # it died before the signal was asked for
        os._exit(1)


def _run(request: RunRequest, program: Program, server: int) -> None:
    """Child side: become the program, as a fresh `python PROGRAM ARGS...` would be, and exit."""
    status = 1
    try:
        os.setsid()
        _die_with_server(server)
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            if fd == 2 and path == request["stdout"]:
                os.dup2(1, 2)  # one log for both, as `> LOG 2>&1`
                continue
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.closerange(3, 65536)  # the server's sockets, pidfds and selector are not the program's
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [program.path, *request["args"]]
        program.enter(request["cwd"])
        random.seed()  # a fork shares its parent's random state; a fresh interpreter would not
        before = set(sys.modules)
        report = threading.Timer(REPORT_AFTER_S, lambda: _report_imports(sorted(set(sys.modules) - before)))
        report.daemon = True
        report.start()
        try:
            exec(program.code, program.main().__dict__)
            status = 0
        finally:
            report.cancel()
            _report_imports(sorted(set(sys.modules) - before))
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would, on stderr
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _imports_file(pid: int) -> str:
    """Where run `pid` lists the modules it imported: beside the server's socket."""
    return os.path.join(_pool_dir, f"imports-{pid}.json")


def _report_imports(names: list[str]) -> None:
    if names := [n for n in names if n != "__main__"]:
        with contextlib.suppress(OSError), open(_imports_file(os.getpid()), "w", encoding="utf-8") as f:
            json.dump(names, f)


def _learn_imports(pid: int) -> None:
    """Import what run `pid` imported that this server has not (a failing import is skipped)."""
    path = _imports_file(pid)
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="utf-8") as f:
            names = json.load(f)
        os.unlink(path)
        for name in names:
            if name not in sys.modules:
                with contextlib.suppress(Exception):
                    __import__(name)


def _kill(pid: int) -> None:
    """SIGKILL the run (not yet reaped, so its pid is still its own) and its session's group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # absent if the run had not reached its setsid yet
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
