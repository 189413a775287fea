"""`python -m scripts.slurm_box up --nodes N | down | status`: the box's one command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.slurm_box.box import BoxError, down, status, up
from scripts.slurm_box.conf import DEFAULT_ROOT, DEFAULT_SUBNET, Box


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.slurm_box", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--nodes", type=int, default=3, help="slurmd hosts envrl-node0.. (up)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_ROOT, help="the box's state; `down` removes it")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="first three octets of the bridge's /24")
    args = parser.parse_args(argv)
    try:
        box = Box(root=args.dir.resolve(), nodes=args.nodes, subnet=args.subnet)
        if args.action == "up":
            up(box)
            for name in box.names:
                print(f"{name} {box.address(name)}")
            print(f"SLURM_CONF={box.conf}")
        elif args.action == "down":
            down(box)
        else:
            print(status(box))
    except (BoxError, ValueError) as e:
        print(f"slurm_box {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
