"""`python -m envrl.runtime.guarded MODULE ARGS`: run `python -m MODULE ARGS` in this process, after taking
the parent-death signal.

Guarantee: the process gets its parent-death signal (`envrl.runtime.lifeline`) before it imports MODULE or
MODULE's package, so a parent that dies while a slow import runs leaves no orphan. For children whose
module cannot call `die_with_parent` first itself: torchrun's ranks (the trainer under
`envrl.launcher.torchrun`; imports alone took a minute on a loaded 2-core box) and the OpenEnv
server an env server starts (its package, `envrl.envs`, imports pydantic and httpx before any line of
the module runs).
"""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m envrl.runtime.guarded MODULE [ARGS...] (a child envrl started)")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
