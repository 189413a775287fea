"""A fork of the API server closes the listening sockets it inherited and keeps every other descriptor."""

from __future__ import annotations

import os
import socket

from envrl.inference.engine_fork import close_inherited_listeners


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_fork_closes_its_inherited_listening_sockets_only() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    near, far = socket.socketpair()
    unbound = socket.socket()
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: report which descriptors are still open after the close
            close_inherited_listeners()
            fds = (listener.fileno(), near.fileno(), unbound.fileno(), read)
            os.write(write, bytes(_is_open(fd) for fd in fds))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert list(os.read(read, 4)) == [0, 1, 1, 1]  # the listener closed; the pair, a plain socket, the pipe kept
        assert _is_open(listener.fileno())  # the parent's own copy is untouched
        with socket.create_connection(listener.getsockname(), timeout=5):
            pass
    finally:
        for s in (listener, near, far, unbound):
            s.close()
        os.close(read)
        os.close(write)
