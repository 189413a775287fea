"""Chaos: SIGKILL the orchestrator or the trainer at a random moment, then `rl --resume`.

    uv run --no-sync python -m scripts.chaos.process_kill --target orchestrator|trainer [--seed 0] [--out DIR]

With its restarts off, the killed run must stop (exit 1, naming the process); the resumed one must finish with every
step trained once, no duplicate line and no lost rollout. Prints one table row.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from tests.support.chaos_runs import RlRun, account, check_unique_lines, report, resume

TARGETS = {"orchestrator": "envrl.orchestrator.main", "trainer": "envrl.trainer.main"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(TARGETS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / f"{args.target}-kill"
    rng = random.Random(args.seed)
    at, delay = rng.randint(2, 35), rng.uniform(0, 2)  # a random moment of a 40-step run (~1-5 s a step)
    with RlRun(out, "--restarts.max-restarts", "0") as run:  # rl would restart it itself
        run.wait_until(f"batch {at}", lambda: run.steps_done() >= at)
        time.sleep(delay)
        killed = run.kill_one(TARGETS[args.target], rng)
        assert killed is not None, f"no {args.target} process to kill (the run finished first?)"
        code = run.finish()
        stopped_at = run.steps_done()
    if code != 1:
        raise SystemExit(f"the run with a killed {args.target} exited {code}, not 1:\n{run.tail()}")
    with resume(run) as resumed:
        code = resumed.finish()
    if code != 0:
        raise SystemExit(f"rl --resume exited {code}:\n{resumed.tail()}")
    check_unique_lines(out)
    report(
        account(
            out,
            f"{args.target} kill + resume",
            f"{args.target} SIGKILLed {delay:.1f} s after batch {at} (published up to batch {stopped_at - 1})",
        )
    )


if __name__ == "__main__":
    main()
