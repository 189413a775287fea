"""Peak memory per trainer rank while 2 CPU ranks load a model: every rank loading the whole
model then sharding it (as the trainer did), against each rank reading only its own shards.

    uv run --no-sync python -m scripts.bench.sharded_load [--model DIR] [--ranks 2]

`--model` defaults to Qwen3-0.6B's shape with random weights (`python -m envrl.model.tiny --shape
qwen3-0.6b`), built once under outputs/bench-weights/. Each rank runs tests/support/sharded_load.py
under torchrun and reports its peak resident memory (VmHWM) over the load and the resident size
before it (the process with torch, transformers and its process group, no weight yet); printed
per rank and as shares of one full fp32 copy of the model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from envrl.model.tiny import build_qwen3_model

DEFAULT_MODEL = Path("outputs/bench-weights/qwen3-0.6b-random")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def load(model: Path, ranks: int, full: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        command = [TORCHRUN, "--standalone", "--nproc-per-node", str(ranks), "-m", "tests.support.sharded_load"]
        subprocess.run([*command, str(model), out, *(["--full"] if full else [])], check=True)
        return [json.loads((Path(out) / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="HF model directory (built if missing)")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        build_qwen3_model(args.model, "qwen3-0.6b")
    gb = 1e9
    for full, label in ((True, "whole model per rank, then sharded"), (False, "own shards from the files")):
        for r in load(args.model, args.ranks, full):
            assert not r["failed"], r["failed"]
            print(
                f"{label:36s} rank {r['rank']}: peak {r['peak_bytes'] / gb:.2f} GB "
                f"({r['peak_bytes'] / r['full_bytes']:.0%} of the fp32 model's {r['full_bytes'] / gb:.2f} GB), "
                f"growth over the load {r['growth_bytes'] / gb:.2f} GB ({r['growth_bytes'] / r['full_bytes']:.0%}), "
                f"before it {r['rss_before_bytes'] / gb:.2f} GB, own fp32 shards {r['shard_bytes'] / gb:.2f} GB"
            )


if __name__ == "__main__":
    main()
