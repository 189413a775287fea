"""A fork of the API server closes the server sockets it inherited (bound, listening or not yet)
and keeps every other descriptor."""

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


def test_a_fork_closes_its_inherited_server_sockets_only() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    bound = socket.socket()  # what vLLM hands uvicorn: bound before the engine starts, listening after
    bound.bind(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=5)  # connected: bound, with a peer
    accepted, _ = listener.accept()
    near, far = socket.socketpair()
    unbound = socket.socket()
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: report which descriptors are still open after the close
            code = 1  # never return into pytest from the fork, whatever raises
            try:
                close_inherited_listeners()
                fds = (listener.fileno(), bound.fileno(), client.fileno(), accepted.fileno(), near.fileno())
                os.write(write, bytes(_is_open(fd) for fd in (*fds, unbound.fileno(), read)))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the listener and the bound socket closed; connections, the pair, a plain socket and the pipe kept
        assert list(os.read(read, 7)) == [0, 0, 1, 1, 1, 1, 1]
        assert _is_open(listener.fileno())  # the parent's own copy is untouched
        with socket.create_connection(listener.getsockname(), timeout=5):
            pass
    finally:
        for s in (listener, bound, client, accepted, near, far, unbound):
            s.close()
        os.close(read)
        os.close(write)
