"""A `run` block of the docs, executed as written in a scratch checkout, and its stated outcome checked.

Guarantee: the block runs under `bash -e` in a directory that holds the checkout's files (linked,
so `uv run --no-sync`, `configs/` and `deps/` resolve as in a clone) and an empty `outputs/`;
every process it started, background jobs included, is gone when `run_block` returns.
Marker options: `append=ARGS` (shortens a run: added to the block's last command, e.g.
`--max-steps 3`), `after=previous` (first runs the page's run block before it, in the same
directory), `timeout=S` (default 300), `until=REGEX` (a server block: stop it once a line
matches), `expect=REGEX` (a line the output must hold), `file=PATH` (must exist after),
`rises=OUTPUT_DIR` (its train reward rises as the smoke run's: the mean of the last 5 steps at
least 0.3 above the first 5's).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from tests.docs.blocks import ROOT, Block
from tests.support.chaos_runs import MARKER, marked_pids
from tests.support.run_files import metric_lines

LEFT_OUT = {".git", "outputs", ".pytest_cache", ".ruff_cache"}


@dataclass(frozen=True)
class Ran:
    code: int
    output: str
    where: Path


def scratch_checkout(where: Path) -> Path:
    """`where` with a link to every top-level entry of the checkout but `outputs/`."""
    where.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in LEFT_OUT:
            (where / entry.name).symlink_to(entry)
    return where


def run_block(block: Block, where: Path) -> Ran:
    """Run `block` in the scratch checkout `where`; its output is also in `where/block.log`."""
    options = block.options
    log = where / "block.log"
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "WANDB_MODE": "offline"}
    until = re.compile(options["until"], re.M) if "until" in options else None
    deadline = time.monotonic() + float(options.get("timeout", 300))
    text = block.text.rstrip() + (f" {options['append']}" if "append" in options else "")
    with log.open("wb") as out:  # a file, not a pipe: background jobs may outlive the shell
        shell = subprocess.Popen(
            ["bash", "-ec", text], cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while shell.poll() is None and time.monotonic() < deadline:
            if until is not None and until.search(log.read_text(errors="replace")):
                break
            time.sleep(0.5)
        code = shell.poll()
        if until is not None and until.search(log.read_text(errors="replace")):
            code = 0  # a server that came up as stated; stopped below
        elif code is None:
            code = 124
    finally:
        _stop(shell, marker)
    return Ran(code, log.read_text(errors="replace"), where)


def _stop(shell: subprocess.Popen[bytes], marker: str) -> None:
    """SIGTERM to everything the block started, SIGKILL to what is left after 30 s."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        for pid in [shell.pid, *marked_pids(marker)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while (shell.poll() is None or marked_pids(marker)) and time.monotonic() < end:
            time.sleep(0.2)
        if shell.poll() is not None and not marked_pids(marker):
            return


def outcome_problems(block: Block, ran: Ran) -> list[str]:
    """The block's stated outcomes that did not appear (none: it did what the page says)."""
    options, found = block.options, []
    if ran.code != 0:
        found.append(f"exit code {ran.code}")
    if "expect" in options and not re.search(options["expect"], ran.output, re.M):
        found.append(f"no line matches {options['expect']!r}")
    if "file" in options and not (ran.where / options["file"]).exists():
        found.append(f"{options['file']} was not written")
    if "rises" in options:
        out = ran.where / options["rises"]
        rewards = [m["train/reward"] for m in metric_lines(out) if "train/reward" in m] if out.is_dir() else []
        if len(rewards) < 10 or fmean(rewards[-5:]) < fmean(rewards[:5]) + 0.3:
            found.append(f"the train reward in {options['rises']}/metrics.jsonl did not rise by 0.3: {rewards}")
    return found
