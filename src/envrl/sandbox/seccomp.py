"""Every sandbox's seccomp filter: EPERM for the syscalls in `DENIED` (those reaching another process's memory or
fds, a keyring, or memory no limit counts), ENOSYS for any non-native ABI, everything else allowed (why: docs/sandbox.md)."""

from __future__ import annotations

import errno
import os
import struct
from functools import cache

from envrl.sandbox.errors import SandboxStartError

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "kcmp",
    "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "memfd_create", "memfd_secret", "shmget", "msgget",
)  # fmt: skip
"""Syscalls every process of a sandbox is refused (EPERM)."""

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
"""AUDIT_ARCH_* (linux/audit.h) of each machine's native ABI: `seccomp_data.arch`."""
_NUMBERS = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
               "process_madvise": 440, "keyctl": 250, "add_key": 248, "request_key": 249, "io_uring_setup": 425,
               "io_uring_enter": 426, "io_uring_register": 427, "memfd_create": 319, "memfd_secret": 447,
               "shmget": 29, "msgget": 68},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
                "process_madvise": 440, "keyctl": 219, "add_key": 217, "request_key": 218, "io_uring_setup": 425,
                "io_uring_enter": 426, "io_uring_register": 427, "memfd_create": 279, "memfd_secret": 447,
                "shmget": 194, "msgget": 186},
}  # fmt: skip
"""Syscall numbers (asm/unistd_64.h of each machine)."""
_X32_BIT = 0x40000000
"""__X32_SYSCALL_BIT: on x86_64, numbers with it set are the x32 ABI's."""

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
_NR, _ARCH = 0, 4
"""Offsets of `nr` and `arch` in `struct seccomp_data`."""
_INSTRUCTION = struct.Struct("=HBBI")
"""`struct sock_filter`: code, jt, jf, k, in the machine's byte order."""


def instructions(machine: str) -> list[tuple[int, int, int, int]]:
    """The program for `machine` as (code, jt, jf, k) tuples; jumps count instructions skipped."""
    if machine not in _NUMBERS:
        raise SandboxStartError(
            f"no seccomp syscall table for machine {machine!r} (envrl/sandbox/seccomp.py knows "
            f"{', '.join(_NUMBERS)}): add its syscall numbers there"
        )
    numbers = [_NUMBERS[machine][name] for name in DENIED]
    deny, foreign = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    # layout: 0 load arch; 1 native? ; 2 ret foreign; 3 load nr; [4 x32?]; n x (nr ==?); allow; deny
    head = [(LD_W_ABS, 0, 0, _ARCH), (JEQ_K, 1, 0, _AUDIT_ARCH[machine]), (RET_K, 0, 0, foreign), (LD_W_ABS, 0, 0, _NR)]
    checks = [(JGE_K, len(numbers) + 2, 0, _X32_BIT)] if machine == "x86_64" else []  # to a ret foreign at the end
    for i, number in enumerate(numbers):
        checks.append((JEQ_K, len(numbers) - i, 0, number))  # to the deny after the allow
    tail = [(RET_K, 0, 0, RET_ALLOW), (RET_K, 0, 0, deny)]
    tail += [(RET_K, 0, 0, foreign)] if machine == "x86_64" else []
    return head + checks + tail


@cache
def program(machine: str | None = None) -> bytes:
    """The compiled program for `machine` (default: this one), as bubblewrap reads it from `--seccomp FD`."""
    return b"".join(_INSTRUCTION.pack(*insn) for insn in instructions(machine or os.uname().machine))
