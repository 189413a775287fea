"""`foreign_listeners(host, port)` names every socket of another uid listening where a local connection to
`host:port` would land, so a client refuses a squatter before sending it a secret; a remote host yields none."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR = 4, 20, 1, 0x300, 3, 2
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")
"""`struct nlmsghdr`: length, type, flags, seq, pid."""
_REQUEST = struct.Struct("=BBBBI48x")
"""`struct inet_diag_req_v2`: family, protocol, ext, pad, states, then an empty `inet_diag_sockid`."""
_MESSAGE = struct.Struct("=BBBBHH16s16sI8xIIIII")
"""`struct inet_diag_msg`: family, state, timer, retrans, sport, dport (big-endian), src, dst,
interface, cookie, expires, rqueue, wqueue, uid, inode."""
WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}


def _dump(family: int) -> list[tuple[int, bytes, int]]:
    """(port, address bytes, uid) of every listening TCP socket of `family` in this network
    namespace, from the kernel's sock_diag (only the listening table is walked: microseconds,
    where reading /proc/net/tcp walks every connection's)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
        nl.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        found = []
        while True:
            data = nl.recv(1 << 16)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind in (NLMSG_DONE, NLMSG_ERROR) or length < _HEADER.size:
                    return found
                fields = _MESSAGE.unpack_from(data, offset + _HEADER.size)
                size = 4 if fields[0] == socket.AF_INET else 16
                found.append((socket.ntohs(fields[4]), fields[6][:size], fields[-2]))
                offset += (length + 3) & ~3


def _address(raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _proc_table(family: int) -> list[tuple[int, bytes, int]]:
    """`_dump` from /proc/net/tcp{,6} (slow: walks every connection), where sock_diag is not served."""
    try:
        lines = Path(f"/proc/net/{'tcp' if family == socket.AF_INET else 'tcp6'}").read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for fields in (line.split() for line in lines):
        (hex_ip, hex_port), state, uid = fields[1].split(":"), fields[3], int(fields[7])
        raw = bytes.fromhex(hex_ip)  # 32-bit words in host (little-endian) byte order
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        found += [(int(hex_port, 16), words, uid)] if int(state, 16) == TCP_LISTEN else []
    return found


def listeners(port: int) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """(address, uid) of every socket listening on TCP `port` in this network namespace."""
    found = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            table = _dump(family)
        except OSError:
            table = _proc_table(family)
        found += [(_address(raw), uid) for bound, raw, uid in table if bound == port]
    return found


@lru_cache(maxsize=256)
def _addresses(host: str) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """`host`'s addresses, and the wildcards when one of them is this machine's (bindable here)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return frozenset()
    found = {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}
    return frozenset(found | WILDCARDS) if any(map(_local, found)) else frozenset(found)


def _local(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def foreign_listeners(host: str, port: int) -> list[str]:
    """'address:port (uid N)' of each socket another uid listens with where `host:port` is served."""
    targets = _addresses(host)
    me = os.getuid()
    found = listeners(port) if targets & WILDCARDS else []  # a remote host: no socket here serves it
    return [f"{address}:{port} (uid {uid})" for address, uid in found if address in targets and uid != me]


class ForeignListener(RuntimeError):
    """Another local user listens where the run's own server should (`squatter_error`'s message)."""


def check_listener(url: str) -> None:
    """`ForeignListener` if another local user listens where `url` is served: call it before a
    secret goes there (a new connection, a reconnect)."""
    if foreign := foreign_listeners_at(url):
        raise ForeignListener(squatter_error(url, foreign))


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
