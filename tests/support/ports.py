"""Free loopback ports for processes a test or script starts.

Guarantee: a returned port was bindable on 127.0.0.1 a moment ago; another process may still take
it before the caller binds it, which the callers' start-up retries and errors make visible.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_base_port() -> int:
    """A base port whose train (base + i) and eval (base + 1000 + i) ports are free now."""
    for _ in range(100):
        base = free_port()
        if base + 1010 > 65000:
            continue
        try:
            for port in (base, base + 1, base + 1000, base + 1001):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block found")
