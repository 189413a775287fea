"""`python -m envrl.launcher.rank MODULE ARGS`: one torchrun rank of a run `rl` started; runs
`python -m MODULE ARGS` in this process.

Guarantee: the rank takes its parent-death signal (towards torchrun, see `envrl.launcher.torchrun`)
before it imports torch or the trainer, so a torchrun that dies while its ranks are still
starting (imports alone took a minute on a loaded 2-core box) leaves none of them behind.
"""

from __future__ import annotations

from envrl.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m envrl.launcher.rank MODULE [ARGS...] (a torchrun rank started by rl)")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
