"""`foreign_listeners(host, port)` names every socket of another uid listening where a local connection to
`host:port` would land, so a client refuses a squatter before sending it a secret; a remote host yields none."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

LISTEN = "0A"
"""The TCP state LISTEN as /proc/net/tcp writes it."""
WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def listeners(
    port: int, proc: Path = Path("/proc/net")
) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """(address, uid) of every socket listening on TCP `port` in this network namespace."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, uid = fields[1], fields[3], fields[7]
            hex_ip, hex_port = local.split(":")
            if state == LISTEN and int(hex_port, 16) == port:
                found.append((_address(hex_ip), int(uid)))
    return found


def _addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def foreign_listeners(host: str, port: int) -> list[str]:
    """'address:port (uid N)' of each socket another uid listens with where `host:port` is served."""
    targets = _addresses(host) | WILDCARDS
    me = os.getuid()
    return [f"{address}:{port} (uid {uid})" for address, uid in listeners(port) if address in targets and uid != me]


def foreign_listeners_at(url: str) -> list[str]:
    """`foreign_listeners` where `url` (http or https, default ports 80 and 443) is served."""
    where = urlsplit(url)
    return foreign_listeners(where.hostname or "", where.port or (443 if where.scheme == "https" else 80))


def squatter_error(url: str, foreign: list[str]) -> str:
    """The one-line error of a client that finds another user listening where its run's server should."""
    return (
        f"{', '.join(foreign)} listens at {url}, not this run's user (uid {os.getuid()}): another local user "
        "took the port of the run's server and would get the run's keys and answer its requests; stop it, or "
        "use another port"
    )
