"""`python -m envrl.launcher.torchrun ARGS`: torchrun (`torch.distributed.run`) as `rl` starts it.

Guarantee: this torchrun dies with `rl`, even when `rl` is SIGKILLed (parent-death signal), and
each rank it starts dies with it (the trainer's `die_with_parent` watches this process), so no
rank outlives the run; torchrun puts every rank in a session of its own, out of reach of the
process-group kill `rl` uses for its other children.
"""

from __future__ import annotations

import sys

from envrl.process import adopt_children, die_with_parent


def main() -> None:
    die_with_parent()  # on rl's death torchrun gets SIGTERM and stops its ranks
    adopt_children()
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:])


if __name__ == "__main__":
    main()
