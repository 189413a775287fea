"""A sandbox's resource limits, set on its first process before bubblewrap, so everything in it inherits them and
nothing can raise them; `nproc` counts per sandbox (docs/sandbox.md)."""

from __future__ import annotations

from pydantic import Field

from envrl.config import BaseConfig

MIB = 1 << 20


class Limits(BaseConfig):
    """What one sandbox may use. Memory and CPU are per process (rlimits); nproc bounds how many."""

    cpu_s: int = Field(30, ge=1)
    """CPU seconds per process (RLIMIT_CPU: SIGXCPU at it, SIGKILL a second later)."""
    memory_mib: int = Field(1024, ge=64)
    """Address space per process (RLIMIT_AS): an allocation past it fails (Python: MemoryError)."""
    nproc: int = Field(64, ge=4)
    """Processes and threads the sandbox may run at once (RLIMIT_NPROC, the agent included)."""
    nofile: int = Field(256, ge=16)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    file_mib: int = Field(64, ge=1)
    """Largest file a process may write (RLIMIT_FSIZE: SIGXFSZ / EFBIG past it)."""
    disk_mib: int = Field(128, ge=1)
    """Size of the sandbox's writable tmpfs (/work and /tmp share it): ENOSPC past it."""
    max_output_kib: int = Field(64, ge=1)
    """Bytes of stdout and of stderr kept per command (the rest is dropped and `truncated` set)."""

    def prlimit_argv(self) -> list[str]:
        """`prlimit` options setting soft and hard limits alike (a process cannot raise either)."""
        return [
            "prlimit",
            f"--cpu={self.cpu_s}:{self.cpu_s + 1}",
            f"--as={self.memory_mib * MIB}",
            f"--nproc={self.nproc}",
            f"--nofile={self.nofile}",
            f"--fsize={self.file_mib * MIB}",
            "--core=0",
            "--",
        ]
