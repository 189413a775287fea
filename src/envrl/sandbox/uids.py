"""Choosing a sandbox's host user id: one nothing else on the host is, or may become, known by.

Guarantee: `claim_free(first, end)` returns the claim (reaper.py) of a uid in [first, end) that
no live sandbox of this user has claimed, that NSS knows neither as a user nor as a group (the
sandbox runs with that gid too), that lies in no range of /etc/subuid or /etc/subgid (another
user's containers map it), and that no process of the host runs as (its real uid: the count
the kernel keeps per user, in any user namespace, is read by a probe that becomes the uid with
`RLIMIT_NPROC` 0: its exec fails with EAGAIN if the uid has any process); else `SandboxStartError`
naming the range and what each tried uid was refused for. A process whose saved uid alone is the
uid (a setuid binary owned by it) is not seen (docs/sandbox.md).
"""

from __future__ import annotations

import grp
import pwd
import secrets
import subprocess
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


def has_processes(uid: int) -> bool:
    """Whether any process runs with real uid `uid`. The probe: `prlimit --nproc=0` then `setpriv`
    to the uid, which flags itself over the limit when the uid already has a process (a count the
    kernel keeps per uid, processes of the uid in user namespaces of its own included), and then
    its exec fails with EAGAIN; a uid with no process execs `true`. No /proc walk (slow for
    thousands of processes), no race with a process that exits meanwhile."""
    probe = subprocess.run(
        ["prlimit", "--nproc=0", "--", *reaper.as_uid(uid), "/bin/true"], env={"PATH": "/usr/bin:/bin"},
        timeout=10, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
    )  # fmt: skip
    if probe.returncode == 0:
        return False
    if "Resource temporarily unavailable" in probe.stderr.decode(errors="replace"):
        return True
    raise SandboxStartError(
        f"the probe for processes of uid {uid} (prlimit --nproc=0 setpriv ... true) failed with "
        f"{probe.returncode}: {probe.stderr[-300:]!r}; it needs util-linux's prlimit and setpriv, run as root"
    )


def claim_free(first: int, end: int) -> reaper.Record:
    """Claim a free uid of [first, end) for a sandbox of this process (blocking: NSS, a probe process)."""
    delegated = subid_ranges()
    start = secrets.randbelow(end - first)
    refused: dict[int, str] = {}
    for i in range(min(TRIES, end - first)):
        uid = first + (start + i) % (end - first)
        if why := known(uid, delegated):
            refused[uid] = why
            continue
        record = reaper.claim(uid)
        if record is None:
            refused[uid] = "claimed by a live sandbox"
            continue
        if has_processes(uid):
            reaper.release(record)
            refused[uid] = "processes run as it"
            continue
        return record
    shown = "; ".join(f"{uid}: {why}" for uid, why in list(refused.items())[:8])
    raise SandboxStartError(
        f"no free sandbox uid in sandbox.host_uids [{first}, {end}) after {len(refused)} tries ({shown}): "
        "choose a range no user, group, subordinate id range or process uses"
    )
