"""Chaos: SIGKILL the train env server once mid-run; the launcher restarts it, the run goes on.

    uv run --no-sync python -m scripts.chaos.env_server_kill [--at-step 10] [--out DIR]

Prints one table row (tests/support/chaos_runs.py); the run must finish, lose nothing and learn.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
from pathlib import Path

from tests.support.chaos_runs import RlRun, account, check_unique_lines, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at-step", type=int, default=10, help="kill once this many batches are published")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / "env-server-kill"
    with RlRun(out) as run:
        run.wait_until(f"batch {args.at_step}", lambda: run.steps_done() >= args.at_step)
        [server] = run.pids("configs/envs/train/")
        os.kill(server, signal.SIGKILL)
        code = run.finish()
    if code != 0:
        raise SystemExit(f"rl exited {code}:\n{run.tail()}")
    check_unique_lines(out)
    report(account(out, "env server kill", f"train env server SIGKILLed at step {args.at_step}"))


if __name__ == "__main__":
    main()
