"""How big the config surface of `rl` is: leaf keys of `RLConfig`, the ones a user may set, and `rl --help`.

    uv run --no-sync python -m scripts.config_keys [--list]

A leaf key is a dotted path to a value (a table's keys count one by one; the keys of a list's tables,
e.g. `orchestrator.envs.pool.num_workers`, count once; union members' keys once each). A user may
set every leaf but those `rl` sets itself (`RLConfig.owned_keys`). `rl --help` (the keys people
change) and `rl --help-all` are counted as they print into a pipe (100 columns): lines and `--flag`
entries. The budgets are tests/unit/test_config_surface.py's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from envrl.config_schema import leaf_keys, user_keys
from envrl.launcher.config import RLConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every user key")
    args = parser.parse_args()
    keys = leaf_keys(RLConfig)
    users = user_keys(RLConfig)
    if args.list:
        print("\n".join(users))
    print(f"RLConfig leaf keys: {len(keys)}; a user may set: {len(users)}")
    rl = Path(sys.executable).parent / "rl"
    for flag in ("--help", "--help-all"):
        text = subprocess.run(
            [rl, flag], capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "100"}
        ).stdout
        flags = [line for line in text.splitlines() if line.startswith("  --")]
        print(f"rl {flag}: {len(text.splitlines())} lines, {len(flags)} flags")


if __name__ == "__main__":
    main()
