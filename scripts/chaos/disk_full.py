"""Chaos: the output dir sits on a small tmpfs that fills up mid-run; free it, then `rl --resume`.

    uv run --no-sync python -m scripts.chaos.disk_full [--size 1g] [--at-step 5] [--dir DIR]

Needs root (mount -t tmpfs). Once `--at-step` batches are published, a filler file takes every
free byte (and keeps taking what is freed) until the run stops; the run must exit 1 with an error
naming the file it could not write, and leave nothing half-published (every published batch,
weights and checkpoint directory complete). Then the filler is deleted and `--resume` must
finish the run with no duplicate line and no lost rollout. Logs go to a directory beside the
tmpfs (a symlink), so the error can be read. Prints the error and one table row.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

from envrl.data.layout import published_steps
from envrl.data.samples import read_batch
from tests.support.chaos_runs import RlRun, account, check_unique_lines, report, resume


def fill(path: Path, stop: threading.Event) -> None:
    """Keep the filesystem of `path` full until `stop` is set."""
    with path.open("ab", buffering=0) as f:  # unbuffered: nothing left to flush (and fail) at close
        while not stop.is_set():
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
            stop.wait(0.2)


def check_complete(out: Path) -> list[str]:
    """What is published but incomplete (empty when everything visible is whole)."""
    problems = []
    for step in published_steps(out / "rollouts"):
        try:
            read_batch(out / "rollouts" / f"step_{step}")
        except ValueError as e:
            problems.append(str(e))
        if not (out / "rollouts" / f"step_{step}" / "orchestrator.json").is_file():
            problems.append(f"batch {step} has no orchestrator.json")
    for step in published_steps(out / "weights"):
        if not (out / "weights" / f"step_{step}" / "model.safetensors").is_file():
            problems.append(f"weights/step_{step} has no model.safetensors")
    for step in published_steps(out / "checkpoints"):
        if not (out / "checkpoints" / f"step_{step}" / "trainer_state.pt").is_file():
            problems.append(f"checkpoints/step_{step} has no trainer_state.pt")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", default="1g", help="tmpfs size (vLLM keeps ~150 MiB of compile caches in the run dir)"
    )
    parser.add_argument("--at-step", type=int, default=5, help="fill the disk once this many batches are published")
    parser.add_argument("--dir", type=Path, default=None, help="where to mount the tmpfs (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="chaos-disk-"))
    mount = args.dir or base / "tmpfs"
    mount.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={args.size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(
            f"mount -t tmpfs failed ({result.stderr.strip()}); this scenario needs root and mount permission"
        )
    try:
        out = mount / "run"
        (base / "logs").mkdir()
        out.mkdir()
        (out / "logs").symlink_to(base / "logs")
        stop = threading.Event()
        filler = threading.Thread(target=fill, args=(mount / "filler", stop))
        with RlRun(out, "--resume") as run:  # --resume: the output dir already holds the logs link
            run.wait_until(f"batch {args.at_step}", lambda: run.steps_done() >= args.at_step)
            filler.start()
            code = run.finish(timeout=600)
            stopped_at = run.steps_done()
        stop.set()
        filler.join()
        logs = "\n".join(p.read_text(errors="replace") for p in (base / "logs").rglob("*.log"))
        errors = [
            line for line in logs.splitlines() if "No space left on device" in line and re.search(r"'/[^']+'", line)
        ]
        problems = check_complete(out)
        if code != 1 or not errors or problems:
            raise SystemExit(
                f"expected exit 1, an ENOSPC error naming a file, nothing half-published; got exit {code}, {problems}:\n{run.tail()}"
            )
        print(f"error: {errors[0].strip()[:300]}")
        os.remove(mount / "filler")
        with resume(run) as resumed:
            code = resumed.finish()
        if code != 0:
            raise SystemExit(f"rl --resume exited {code}:\n{resumed.tail()}")
        check_unique_lines(out)
        report(
            account(
                out,
                "disk full + resume",
                f"tmpfs {args.size} filled at batch {args.at_step} (stopped at batch {stopped_at})",
            )
        )
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


if __name__ == "__main__":
    main()
