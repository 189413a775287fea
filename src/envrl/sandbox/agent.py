"""The agent inside a sandbox: every request gets exactly one frame echoing its `seq` and `nonce`, output is
bounded, its pipes reach no command, a `verdict` runs after every other process is gone on files it creates
(`O_EXCL|O_NOFOLLOW`) in a new directory; stdlib only. Usage: `python3 -I -S -c <this file> REQUESTS_FD ANSWERS_FD`"""

import base64
import contextlib
import json
import os
import selectors
import signal
import stat
import struct
import subprocess
import sys
import time

HEADER = struct.Struct(">I")
DRAIN_S = 0.05
"""How long output is still read after the command exited (from what it left running)."""
KILL_WAIT_S = 5.0
"""How long `_kill_others` waits for the killed to be gone."""


def _non_dumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001 - an image without ctypes still runs; docs/sandbox.md says what is lost
        pass


def _read_exact(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _send(fd, message):
    body = json.dumps(message).encode()
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _kill_others():
    """SIGKILL every process of the sandbox but this one and the namespace's init, and wait until
    none is left (kill(-1) finds no one), so the next command starts with nothing else running.
    False if some were still there after `KILL_WAIT_S`."""
    give_up = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < give_up:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True
        while True:  # reap what were our children (the init reaps the others)
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break
        time.sleep(0.005)
    return False


def _run(request):
    if request.get("isolate"):  # deprecated (base.py): a verdict is `_verdict`
        _kill_others()
    cmd = request["cmd"]
    limit = int(request["max_output"])
    deadline = time.monotonic() + float(request["timeout"])
    stdin = request.get("stdin")
    env = dict(os.environ)
    env.update(request.get("env") or {})
    proc = subprocess.Popen(
        cmd, shell=isinstance(cmd, str), cwd=request.get("cwd") or None, start_new_session=True, env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    if stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin.encode())
        proc.stdin.close()
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    truncated = False
    sel = selectors.DefaultSelector()
    for stream in kept:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    timed_out = False
    exited_at = None
    while sel.get_map():
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > DRAIN_S:
            break  # a background process holds the pipes open: what it wrote so far is kept
        if exited_at is None and now >= deadline:
            timed_out = True
            break
        events = sel.select(0.01 if exited_at is not None else min(deadline - now, 0.05))
        for key, _ in events:
            chunk = key.fileobj.read(65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf = kept[key.fileobj]
            room = limit - len(buf)
            truncated = truncated or len(chunk) > room
            buf += chunk[: max(room, 0)]
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    if timed_out:
        _kill_others()  # what it started in sessions of its own too
    for stream in kept:
        stream.close()
    return {
        "exit_code": code,
        "stdout": kept[proc.stdout].decode(errors="replace"),
        "stderr": kept[proc.stderr].decode(errors="replace"),
        "timed_out": timed_out,
        "truncated": truncated,
    }


def _regular(path, flags, mode=0o644):
    """An fd of `path`, a regular file (never a link, FIFO or device: `O_NOFOLLOW|O_NONBLOCK`, then fstat)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _write_fd(fd, data, mode):
    with open(fd, "wb") as f:
        f.write(data)
        os.fchmod(fd, mode)


def _write(request):
    path = request["path"]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = _regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    _write_fd(fd, base64.b64decode(request["data"]), int(request.get("mode", 0o644)))
    return {}


def _clean_room(request):
    """The new directory of a verdict, holding only the host's files; every other process gone."""
    if not _kill_others():
        raise OSError(f"processes of the episode outlived SIGKILL for {KILL_WAIT_S:g} s")
    room = os.path.join(request["cwd"], f"verdict-{os.urandom(8).hex()}")
    os.mkdir(room, 0o700)
    for name, data in request["files"].items():
        parts = name.split("/")
        if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"verdict file name {name!r} must be relative, without '.' or '..' parts")
        for depth in range(1, len(parts)):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(room, *parts[:depth]), 0o755)
        fd = _regular(os.path.join(room, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        _write_fd(fd, base64.b64decode(data), 0o644)
    return room


def _verdict(request):
    """`run` in a clean room (`_clean_room`), HOME and TMPDIR in it. A room the episode left no
    means to make (disk full, a process SIGKILL did not end) is the program's failure, exit 126."""
    try:
        room = _clean_room(request)
    except (OSError, ValueError) as e:
        message = f"verdict: no clean room could be made: {type(e).__name__}: {e}\n"
        return {"exit_code": 126, "stdout": "", "stderr": message, "timed_out": False, "truncated": False}
    env = dict(request.get("env") or {}, HOME=room, TMPDIR=room)
    return _run(dict(request, cwd=room, env=env))


def _read(request):
    with open(_regular(request["path"], os.O_RDONLY), "rb") as f:
        data = f.read(int(request["max_bytes"]) + 1)
    limit = int(request["max_bytes"])
    return {"data": base64.b64encode(data[:limit]).decode(), "truncated": len(data) > limit}


OPS = {"run": _run, "write": _write, "read": _read, "verdict": _verdict}


def main():
    _non_dumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # stderr too: the host stops reading bubblewrap's once this agent is ready
        os.dup2(null, fd)
    os.close(null)
    os.set_inheritable(rfd, False)
    os.set_inheritable(wfd, False)
    _send(wfd, {"ready": True})
    while True:
        try:
            (size,) = HEADER.unpack(_read_exact(rfd, HEADER.size))
            request = json.loads(_read_exact(rfd, size))
        except EOFError:
            return
        try:
            answer = OPS[request["op"]](request)
        except Exception as e:  # noqa: BLE001 - the host gets the failure as the answer
            answer = {"error": f"{type(e).__name__}: {e}", "kind": type(e).__name__}
        answer["seq"], answer["nonce"] = request.get("seq"), request.get("nonce")
        _send(wfd, answer)


if __name__ == "__main__":
    sys.exit(main())
