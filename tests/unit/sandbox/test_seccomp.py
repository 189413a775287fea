"""The sandbox's seccomp program: what it answers for each syscall and ABI, read by a small
classic-BPF interpreter, and what the kernel does with it loaded in a real process."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys

import pytest

from envrl.sandbox import seccomp
from envrl.sandbox.errors import SandboxStartError

ALLOW, DENY, FOREIGN = seccomp.RET_ALLOW, seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_ERRNO | errno.ENOSYS


def run_filter(program: bytes, nr: int, arch: int) -> int:
    """What the kernel would return for syscall `nr` of ABI `arch`: the opcodes the builder uses only."""
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iI", nr, arch)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.LD_W_ABS:
            (acc,) = struct.unpack_from("=I", data, k)
            pc += 1
        elif code in (seccomp.JEQ_K, seccomp.JGE_K):
            taken = acc == k if code == seccomp.JEQ_K else acc >= k
            pc += 1 + (jt if taken else jf)
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_denied_syscalls_get_eperm_and_every_other_native_one_is_allowed(machine: str) -> None:
    program = seccomp.program(machine)
    arch = seccomp._AUDIT_ARCH[machine]
    denied = set(seccomp._NUMBERS[machine].values())
    assert len(denied) == len(seccomp.DENIED)
    for nr in range(0, 1024):
        assert run_filter(program, nr, arch) == (DENY if nr in denied else ALLOW), nr


def test_other_abis_get_enosys_whatever_the_number() -> None:
    program = seccomp.program("x86_64")
    i386, native = 0x40000003, seccomp._AUDIT_ARCH["x86_64"]
    for nr in (0, 1, 26, 101, 347, 348):  # i386: 26 is ptrace, 347/348 process_vm_readv/writev
        assert run_filter(program, nr, i386) == FOREIGN
    for nr in (0x40000000, 0x40000000 + 521, 0x40000000 + 539):  # x32: its ptrace and process_vm_*
        assert run_filter(program, nr, native) == FOREIGN
    assert run_filter(seccomp.program("aarch64"), 117, 0x40000028) == FOREIGN  # arm32 on aarch64


def test_a_machine_without_a_table_cannot_start_a_sandbox() -> None:
    with pytest.raises(SandboxStartError, match="no seccomp syscall table for machine 'riscv64'"):
        seccomp.program("riscv64")


LOADED = """
import ctypes, os, struct, sys
program = bytes.fromhex(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
prog = Prog(len(program) // 8, program)
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
numbers = {names}
for name in sys.argv[2:]:
    result = libc.syscall(numbers[name], 0, 0, 0, 0, 0, 0)
    print(name, result, ctypes.get_errno())
print("pid", os.getpid() > 0, open("/proc/self/status").read().count("Seccomp:\\t2"))
"""


@pytest.mark.skipif(os.uname().machine not in seccomp._NUMBERS, reason="no table for this machine")
def test_the_kernel_accepts_the_program_and_refuses_the_syscalls_in_a_real_process() -> None:
    numbers = {**seccomp._NUMBERS[os.uname().machine], "getppid": {"x86_64": 110, "aarch64": 173}[os.uname().machine]}
    code = LOADED.replace("{names}", repr(numbers))
    out = subprocess.run(
        [sys.executable, "-c", code, seccomp.program().hex(), *seccomp.DENIED, "getppid"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.splitlines()  # fmt: skip
    for name, line in zip(seccomp.DENIED, out, strict=False):
        assert line == f"{name} -1 {errno.EPERM}", out
    assert out[len(seccomp.DENIED)].startswith(f"getppid {os.getpid()} "), out
    assert out[-1] == "pid True 1", out  # a filter is in force, and ordinary syscalls still work
