"""Running a command to completion in tests, never leaving its process tree behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


def run_to_completion(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `argv` (stdout and stderr together); its whole process group is killed if it outlives `timeout`."""
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
