"""Chaos: SIGKILL random sandbox processes and busy env workers through a code-exec `rl` run.

    uv run --no-sync python -m scripts.chaos.sandbox_kills [--interval 1] [--steps 20] [--out DIR]

Every `interval` seconds one random process of a live sandbox is SIGKILLed (bubblewrap, the pid
namespace's init, the agent, or code it runs), and every `worker_every`-th time a busy env worker.
The run must finish (exit 0), and once it has, no sandbox process may be alive. Prints the
rollouts, the error rollouts by type (a killed sandbox is a typed `sandbox_died` error, never a
reward), and the kills.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
import time
from pathlib import Path

from tests.support.chaos_runs import ROOT, RlRun, kill_random
from tests.support.sandboxes import ALL_SANDBOXES, processes_of, wait_gone

CODE_EXEC = ROOT / "configs" / "debug" / "code_exec.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between kills")
    parser.add_argument("--worker-every", type=int, default=5, help="every n-th kill is a busy env worker")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / "sandbox-kills"
    rng = random.Random(args.seed)
    kills: collections.Counter[str] = collections.Counter()
    overrides = ["--config", str(CODE_EXEC), "--orchestrator.eval.env", "[]", "--max-steps", str(args.steps)]
    with RlRun(out, *overrides) as run:
        run.wait_until("the first batch", lambda: run.steps_done() >= 1)
        while run.proc.poll() is None:
            if (sum(kills.values()) + 1) % args.worker_every == 0:
                kills["env worker"] += run.kill_busy_worker(rng, timeout=2.0) is not None
            else:
                kills["sandbox process"] += kill_random(processes_of(ALL_SANDBOXES), rng) is not None
            time.sleep(args.interval)
        code = run.finish()
    left = wait_gone(ALL_SANDBOXES, timeout=10.0)
    traces = [json.loads(line) for line in (out / "rollouts" / "train.jsonl").read_text().splitlines()]
    errors = collections.Counter(t["error"]["type"] for t in traces if t.get("error"))
    print(f"rl exit {code}; {len(traces)} rollouts, {sum(errors.values())} errors {dict(errors)}; kills {dict(kills)}")
    print(f"sandbox processes alive after the run: {len(left)}")
    if code != 0 or left:
        raise SystemExit(f"FAILED: rl exit {code}, {len(left)} sandbox processes left:\n{run.tail()}")


if __name__ == "__main__":
    main()
