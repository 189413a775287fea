"""The agent inside a sandbox: every request gets exactly one frame echoing its `seq` and `nonce`, output is
bounded, and its protocol pipes reach no command; stdlib only. Usage: `python3 -I -S -c <this file> REQUESTS_FD
ANSWERS_FD`"""

import base64
import contextlib
import json
import os
import selectors
import signal
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
    none is left (kill(-1) finds no one), so the next command starts with nothing else running."""
    give_up = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < give_up:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        while True:  # reap what were our children (the init reaps the others)
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break
        time.sleep(0.005)


def _run(request):
    if request.get("isolate"):
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


def _write(request):
    path = request["path"]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(request["data"]))
    os.chmod(path, int(request.get("mode", 0o644)))
    return {}


def _read(request):
    with open(request["path"], "rb") as f:
        data = f.read(int(request["max_bytes"]) + 1)
    limit = int(request["max_bytes"])
    return {"data": base64.b64encode(data[:limit]).decode(), "truncated": len(data) > limit}


OPS = {"run": _run, "write": _write, "read": _read}


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
