"""Who listens on a port: the kernel's sock_diag answer, the same as /proc/net/tcp's, and nothing for a remote host."""

from __future__ import annotations

import os
import socket

from envrl.runtime import listeners


def test_sock_diag_and_proc_name_the_same_listeners_and_a_remote_host_none() -> None:
    v4, v6 = socket.socket(), socket.socket(socket.AF_INET6)
    with v4, v6:
        v4.bind(("127.0.0.1", 0))
        v6.bind(("::", 0))
        v4.listen()
        v6.listen()
        ours = {v4.getsockname()[1], v6.getsockname()[1]}  # other processes' listeners come and go meanwhile
        for family in (socket.AF_INET, socket.AF_INET6):
            diag, proc = listeners._dump(family), listeners._proc_table(family)
            assert sorted(e for e in diag if e[0] in ours) == sorted(e for e in proc if e[0] in ours) != []
        port = v6.getsockname()[1]
        assert listeners.listeners(port) == [(listeners.ipaddress.ip_address("::"), os.getuid())]
        assert listeners.foreign_listeners("127.0.0.1", port) == []  # ours
        assert listeners._addresses("192.0.2.1") == frozenset({listeners.ipaddress.ip_address("192.0.2.1")})
        assert listeners.foreign_listeners("192.0.2.1", port) == []  # TEST-NET-1: not this machine's
