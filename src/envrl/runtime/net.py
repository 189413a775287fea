"""Loopback and free ports: anything not provably loopback (a wildcard, an interface, a DNS name other than
localhost) counts as exposed, so security checks fail closed."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an IP address or name to bind or connect to) is reachable only from here."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback(address: str) -> bool:
    """True for ipc://, inproc:// and tcp:// addresses on 127.0.0.0/8, ::1 or localhost."""
    parts = urlsplit(address)
    if parts.scheme in ("ipc", "inproc"):
        return True
    return is_loopback_host(parts.hostname or "")


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` now, as the servers do (SO_REUSEADDR: connections
    of a run that just ended, in TIME_WAIT, do not block the port)."""
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True
