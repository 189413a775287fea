"""Chaos: SIGKILL a random env worker every few seconds through a whole smoke run.

    uv run --no-sync python -m scripts.chaos.worker_kills [--interval 5] [--out DIR]

Each kill waits until the train env server has rollouts in flight, so it loses work (a kill of
an idle worker tests nothing but the pool's restart). The env server re-runs a dead worker's
rollouts once by itself (invisible to the orchestrator, so not in `retried`); the row's faults
column counts those re-runs from the server's log.

Prints one table row (tests/support/chaos_runs.py); the run must finish, lose nothing and learn.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from pathlib import Path

from tests.support.chaos_runs import RlRun, account, check_unique_lines, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / "worker-kills"
    rng = random.Random(args.seed)
    kills = 0
    with RlRun(out) as run:
        run.wait_until("the first batch", lambda: run.steps_done() >= 1)
        while run.proc.poll() is None:
            kills += run.kill_busy_worker(rng) is not None
            time.sleep(args.interval)
        code = run.finish()
    if code != 0:
        raise SystemExit(f"rl exited {code}:\n{run.tail()}")
    check_unique_lines(out)
    log = (out / "logs" / "envs" / "train" / "learnable.log").read_text()
    rerun = sum(int(m) for m in re.findall(r"re-running (\d+) once", log))
    report(account(out, "worker kills", f"{kills} worker SIGKILLs; {rerun} rollouts re-run inside the env server"))


if __name__ == "__main__":
    main()
