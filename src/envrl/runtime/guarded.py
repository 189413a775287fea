"""`python -m envrl.runtime.guarded MODULE ARGS`: `python -m MODULE ARGS` that takes the parent-death signal before
importing MODULE or its package, so a parent dying during a slow import leaves no orphan."""

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
