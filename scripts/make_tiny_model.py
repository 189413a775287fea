"""Build the tiny offline chat model: `python scripts/make_tiny_model.py --out DIR [--seed N]`.

The repo ships the seed-0 build in deps/models/tiny-chat; rebuild it with the default --out.
"""

import argparse
from pathlib import Path

from envrl.tiny_model import DEFAULT_DIR, build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"output directory (default: {DEFAULT_DIR})")
    parser.add_argument("--seed", type=int, default=0, help="weight-initialisation seed (default: 0)")
    args = parser.parse_args()
    out = build_tiny_model(args.out, args.seed)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote tiny model (seed {args.seed}) to {out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
