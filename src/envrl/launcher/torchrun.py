"""`python -m envrl.launcher.torchrun ARGS`: torchrun as `rl` starts it, dying with `rl` (even SIGKILLed) and taking
every rank with it."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import os
import sys

from envrl.runtime.lifeline import adopt_children


def main() -> None:
    adopt_children()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:])
    except SignalException as e:  # the run is being stopped: one line, not torchrun's traceback
        print(f"torchrun (pid {os.getpid()}): {e.sigval.name} received; its ranks were stopped", file=sys.stderr)
        raise SystemExit(128 + int(e.sigval)) from None


if __name__ == "__main__":
    main()
