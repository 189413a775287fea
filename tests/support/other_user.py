"""Another local user for tests of what `rl` keeps private: `nobody`, through `setpriv` (as root).

Guarantee: `as_nobody` runs a command as uid `nobody` in one group (default `nogroup`), and
`reachable_dir` gives a directory that user may traverse (pytest's own temporary root is private
to root, which would hide any leak), removed afterwards even on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("acting as another user needs root and setpriv")


def as_nobody(argv: Sequence[str], group: str = "nogroup", timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `nobody` in `group` only; its exit code and output."""
    user = ["setpriv", "--reuid=nobody", f"--regid={group}", "--clear-groups"]
    return subprocess.run([*user, *argv], capture_output=True, text=True, timeout=timeout)


@contextmanager
def reachable_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that every user may traverse (mode 0755)."""
    path = Path(tempfile.mkdtemp(prefix="envrl-other-user-", dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
