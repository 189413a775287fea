"""What a sandbox could hold outside every limit, and the host's keyring: each door tried from inside, each shut.

Issue 53: `/dev/shm` (in bubblewrap's unsized `/dev`), bubblewrap's root tmpfs, `memfd_create`
and SysV segments held memory no limit counted; `keyctl` reached the worker's session keyring.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import uuid

import pytest

from envrl.sandbox import BubblewrapProvider, Limits, SandboxConfig
from tests.support.sandboxes import wait_gone

DISK_MIB = 16
TRIED_MIB = 4 * DISK_MIB

DOORS = """
import ctypes, errno, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MIB, TRIED = 1 << 20, TRIED_MIB
NR = {"x86_64": {"memfd_create": 319, "shmget": 29, "msgget": 68, "keyctl": 250},
      "aarch64": {"memfd_create": 279, "shmget": 194, "msgget": 186, "keyctl": 219}}[os.uname().machine]
seen = {}

def fill(path):
    held = 0
    try:
        with open(path, "wb") as f:
            while held < TRIED * MIB:
                f.write(b"x" * MIB)
                f.flush()
                held += MIB
    except OSError as e:
        return {"held_mib": held // MIB, "error": errno.errorcode[e.errno]}
    return {"held_mib": held // MIB}

seen["dev_shm"] = fill("/dev/shm/held")
seen["root"] = fill("/held")
seen["dev"] = fill("/dev/held")

def call(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(NR[name], *args)
    return result, errno.errorcode.get(ctypes.get_errno(), "0")

fd, err = call("memfd_create", b"held", 0)
seen["memfd"] = {"error": err} if fd < 0 else fill(f"/proc/self/fd/{fd}")
seen["shmget"] = call("shmget", 0, ctypes.c_size_t(TRIED * MIB), 0o1600)[1]  # IPC_PRIVATE, IPC_CREAT
seen["msgget"] = call("msgget", 0, 0o1600)[1]
key, err = call("keyctl", 10, ctypes.c_int(-3), b"user", KEY_NAME, 0)  # SEARCH the session keyring
buf = ctypes.create_string_buffer(256)
seen["keyring"] = err if key < 0 else ctypes.string_at(buf, call("keyctl", 11, key, buf, 256)[0]).decode()
print(json.dumps(seen))
"""


def _host_key(secret: str) -> bytes:
    """A key holding `secret` in a fresh session keyring of this process (what a container's worker has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    keyctl, add_key = {"x86_64": (250, 248), "aarch64": (219, 217)}[os.uname().machine]
    assert libc.syscall(keyctl, 1, None) >= 0, ctypes.get_errno()  # KEYCTL_JOIN_SESSION_KEYRING: a fresh one
    name = f"envrl-test-{uuid.uuid4().hex}".encode()
    data = secret.encode()
    assert libc.syscall(add_key, b"user", name, data, len(data), ctypes.c_int(-3)) > 0, ctypes.get_errno()
    return name


def test_memory_a_sandbox_could_hold_outside_its_limits_and_the_host_keyring_are_refused() -> None:
    secret = f"envrl-key-{uuid.uuid4().hex}"
    name = _host_key(secret)
    program = DOORS.replace("TRIED_MIB", str(TRIED_MIB)).replace("KEY_NAME", repr(name))

    async def main() -> dict[str, object]:
        box = await BubblewrapProvider().create(SandboxConfig(limits=Limits(disk_mib=DISK_MIB)))
        try:
            with pytest.warns(DeprecationWarning, match="Sandbox.verdict"):  # isolate: no clean room
                await box.run("true", isolate=True)
            await box.write_file("doors.py", program)
            result = await box.run(["python3", "doors.py"], timeout=60)
            assert result.exit_code == 0, result.stderr
            return json.loads(result.stdout)
        finally:
            await box.close()
            assert wait_gone(box.uid) == []

    seen = asyncio.run(main())
    assert seen["dev_shm"] == {"held_mib": DISK_MIB, "error": "ENOSPC"}, seen  # sized as the workdir
    assert seen["root"] == {"held_mib": 0, "error": "EROFS"} and seen["dev"] == seen["root"], seen
    assert seen["memfd"] == {"error": "EPERM"} and seen["shmget"] == seen["msgget"] == "EPERM", seen
    assert seen["keyring"] == "EPERM" and secret not in json.dumps(seen), seen
