"""How big the config surface of `rl` is: leaf keys of `RLConfig`, the ones a user may set, and `rl --help`.

    uv run --no-sync python -m scripts.config_keys [--list]

A leaf key is a dotted path to a value (a table's keys count one by one; the keys of a list's tables,
e.g. `orchestrator.envs.pool.num_workers`, count once; union members' keys once each). A user may
set every leaf but those `rl` sets itself (`RLConfig.owned_keys`). `rl --help` is counted as it
prints into a pipe (100 columns): its lines and its `--flag` entries.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from envrl.config_schema import unwrap_types
from envrl.launcher.config import RLConfig


def leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted leaf key of `model` (tables in lists and union members walked, each key once)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        types = unwrap_types(field.annotation)
        items = [t for tp in types if typing.get_origin(tp) is list for t in unwrap_types(typing.get_args(tp)[0])]
        tables = [t for t in [*types, *items] if isinstance(t, type) and issubclass(t, BaseModel)]
        if not tables:
            out.append(f"{prefix}{name}")
        for table in tables:
            out += [key for key in leaf_keys(table, f"{prefix}{name}.") if key not in out]
    return out


def user_keys(keys: list[str]) -> list[str]:
    """The keys not set by `rl` itself (an owned table owns every key below it)."""
    owned = RLConfig.owned_keys
    return [key for key in keys if not any(key == o or key.startswith(f"{o}.") for o in owned)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every user key")
    args = parser.parse_args()
    keys = leaf_keys(RLConfig)
    users = user_keys(keys)
    rl = Path(sys.executable).parent / "rl"
    help_text = subprocess.run(
        [rl, "--help"], capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "100"}
    ).stdout
    flags = [line for line in help_text.splitlines() if line.startswith("  --")]
    if args.list:
        print("\n".join(users))
    print(f"RLConfig leaf keys: {len(keys)}; a user may set: {len(users)}")
    print(f"rl --help: {len(help_text.splitlines())} lines, {len(flags)} flags")


if __name__ == "__main__":
    main()
