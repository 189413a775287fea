"""Chaos: flip one byte inside one column of a published batch before the trainer reads it.

    uv run --no-sync python -m scripts.chaos.corrupt_batch [--column COLUMN] [--seed 0] [--out DIR]

The trainer is paused (SIGSTOP) while the orchestrator publishes the batch it will read next;
one byte in the middle of that batch's `--column` (default: a random one) is flipped in the
file, and the trainer resumed. It must stop naming the file and the column, and train nothing
on it (no metrics line for that step, no weights after it). Prints one table row.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
from pathlib import Path

import msgpack

from envrl.data.samples import BATCH_COLUMNS, BATCH_FILE
from tests.support.chaos_runs import RlRun, account, report
from tests.support.run_files import metric_lines


def trained_steps(out: Path) -> list[int]:
    lines = metric_lines(out)
    return [m["step"] for m in lines if "trainer/loss" in m]


def flip_byte_in_column(file: Path, column: str) -> int:
    """Flip one bit of the file inside `column`'s blob; return the file offset."""
    data = bytearray(file.read_bytes())
    blob = msgpack.unpackb(bytes(data))["columns"][column]
    offset = bytes(data).index(blob) + len(blob) // 2
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))
    return offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--column", choices=BATCH_COLUMNS, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    column = args.column or random.Random(args.seed).choice(BATCH_COLUMNS)
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-")) / "corrupt-batch"
    with RlRun(out) as run:
        run.wait_until("5 trained steps", lambda: (out / "metrics.jsonl").exists() and len(trained_steps(out)) >= 5)
        [trainer] = run.pids("envrl.trainer.main")
        os.kill(trainer, signal.SIGSTOP)
        target = len(trained_steps(out)) + 1  # the trainer may be inside step len(trained); it reads this one next
        run.wait_until(f"batch {target}", lambda: (out / "rollouts" / f"step_{target}").is_dir())
        file = out / "rollouts" / f"step_{target}" / BATCH_FILE
        offset = flip_byte_in_column(file, column)
        os.kill(trainer, signal.SIGCONT)
        code = run.finish()
    log = (out / "logs" / "trainer.log").read_text()
    named = f"{file}" in log and f"column '{column}'" in log
    untouched = target not in trained_steps(out) and not (out / "weights" / f"step_{target + 1}").exists()
    if code != 1 or not named or not untouched:
        raise SystemExit(
            f"expected exit 1, the file and column named, step {target} untrained; got exit {code}:\n{run.tail()}"
        )
    print(next(line for line in log.splitlines() if "column" in line))
    report(account(out, "corrupt batch", f"byte {offset} of {file.name} (column {column}) of step {target} flipped"))


if __name__ == "__main__":
    main()
