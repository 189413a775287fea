"""`claim_free(first, end)`: a uid no live sandbox claimed, unknown to NSS, outside every subuid/subgid range, or a
`SandboxStartError` saying why each was refused; a launch on a busy uid raises `UidBusy`."""

from __future__ import annotations

import grp
import pwd
import secrets
from collections.abc import Iterable
from pathlib import Path

from envrl.sandbox import reaper
from envrl.sandbox.errors import SandboxStartError

FIRST = 1_000_000_000
"""Default first host uid of sandboxes (`sandbox.host_uids`): above any real user's."""
COUNT = 1 << 24
"""Default number of host uids sandboxes are drawn from."""
SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
TRIES = 64
"""Uids tried (consecutive, from a random one) before a start fails."""
IF_FREE = ["prlimit", "--nproc=0:", "--"]
"""Put before `setpriv` to the uid: setpriv then flags itself over RLIMIT_NPROC when the uid
already has a process (the kernel's per-uid count, processes of the uid inside user namespaces
and not yet reaped ones included), and its next exec fails with EAGAIN (exit 126, `BUSY_MESSAGE`).
The soft limit only (the hard one stays: raising it needs CAP_SYS_RESOURCE); the `prlimit` it
execs as the uid sets the sandbox's own."""
BUSY_MESSAGE = b"Resource temporarily unavailable"


class UidBusy(Exception):
    """A launch found its uid in use by processes (nothing was started)."""


def subid_ranges(files: Iterable[Path] = SUBID_FILES) -> list[range]:
    """The ranges delegated to users in `files` (`name:first:count` lines; others skipped)."""
    ranges = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise SandboxStartError(f"cannot read {path} to keep sandbox uids out of its ranges: {e}") from e
        for line in lines:
            fields = line.split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                ranges.append(range(int(fields[1]), int(fields[1]) + int(fields[2])))
    return ranges


def known(uid: int, delegated: list[range]) -> str | None:
    """Why `uid` belongs to someone already (None: to no one NSS or a subid file knows)."""
    try:
        return f"NSS user {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        pass
    try:
        return f"NSS group {grp.getgrgid(uid).gr_name!r}"
    except KeyError:
        pass
    for ids in delegated:
        if uid in ids:
            return f"in the subordinate id range {ids.start}-{ids.stop - 1}"
    return None


def claim_free(first: int, end: int, refused: dict[int, str]) -> reaper.Record:
    """Claim a uid of [first, end) for a sandbox of this process that is not in `refused` (uids a
    launch found busy), no one NSS knows, in no subid range (blocking: NSS may ask a server);
    every uid passed over is added to `refused` with why."""
    delegated = subid_ranges()
    start = secrets.randbelow(end - first)
    for i in range(min(TRIES, end - first)):
        uid = first + (start + i) % (end - first)
        if uid in refused:
            continue
        if why := known(uid, delegated):
            refused[uid] = why
            continue
        record = reaper.claim(uid)
        if record is not None:
            return record
        refused[uid] = "claimed by a live sandbox"
    shown = "; ".join(f"{uid}: {why}" for uid, why in list(refused.items())[:8])
    raise SandboxStartError(
        f"no free sandbox uid in sandbox.host_uids [{first}, {end}) after {len(refused)} refused ({shown}): "
        "choose a range no user, group, subordinate id range or process uses"
    )
