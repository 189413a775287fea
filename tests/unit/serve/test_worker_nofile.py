"""An env worker checks its RLIMIT_NOFILE at start: a soft limit below what its sandboxes' bridge
relays may need is raised (up to the hard limit), and one the hard limit keeps low is a warning
that names both numbers. Each case runs in a child started under `prlimit` (real rlimits)."""

from __future__ import annotations

import subprocess
import sys

from envrl.serve.worker import NOFILE_NEEDED

PROBE = (
    "import resource, sys; from loguru import logger; logger.remove(); logger.add(sys.stdout, format='{message}'); "
    "from envrl.serve.worker import check_nofile; check_nofile(); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
)


def _under(soft: int, hard: int) -> list[str]:
    argv = ["prlimit", f"--nofile={soft}:{hard}", sys.executable, "-c", PROBE]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()


def test_a_low_soft_nofile_limit_is_raised_to_what_the_worker_needs() -> None:
    assert _under(256, NOFILE_NEEDED * 4) == [str(NOFILE_NEEDED)]


def test_a_hard_limit_below_the_need_raises_the_soft_limit_to_it_and_warns_with_the_numbers() -> None:
    *warning, soft = _under(256, 512)
    assert soft == "512"
    (line,) = warning
    assert "RLIMIT_NOFILE is 512 (hard limit 512)" in line and str(NOFILE_NEEDED) in line
