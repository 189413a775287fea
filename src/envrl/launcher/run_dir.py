"""`rl` writes only into an empty directory or one its marker claims, made private first (0700, or 0750 for
`output_dir_group`); `--clean` deletes only the entries the run layout names, never an unmarked directory."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from loguru import logger

from envrl.config import ConfigError, config_to_toml
from envrl.data import layout
from envrl.data.layout import user_config_file
from envrl.data.private_dir import refuse_foreign_owner
from envrl.launcher.config import RLConfig

MARKER = layout.run_marker_file(Path()).name
"""The marker's name (`layout.run_marker_file`), for listing the dir's entries."""

RUN_ENTRIES = (
    "logs",
    "configs",
    "curve",
    "rollouts",
    "weights",
    "checkpoints",
    "ledger",
    "report",
    "wandb",
    "inference",
    "metrics.jsonl",
    "summary.json",
)
"""What a run writes directly under its output dir; `--clean` removes these and nothing else."""


def resume_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with `--config <output_dir>/configs/rl.toml` first when it resumes a run without a
    `--config` of its own, so the stored config comes back and the command line's keys override it."""
    args = list(argv)
    if "--resume" not in args or any(a == "--config" or a.startswith("--config=") for a in args):
        return args
    output_dir = _option(args, "--output-dir") or _option(args, "--output_dir")
    if output_dir is None:
        return args
    stored = user_config_file(Path(output_dir))
    if Path(output_dir).is_dir():
        refuse_foreign_owner(Path(output_dir))  # before anything in it is read
    if stored.is_file() and stored.lstat().st_uid != os.geteuid():
        raise ConfigError(f"--resume: {stored} belongs to uid {stored.lstat().st_uid}, not to this user: not read")
    if not stored.is_file():
        raise ConfigError(
            f"--resume without --config: {stored} not found; pass the run's --config, or check --output-dir"
        )
    logger.info(f"resuming with the run's stored config {stored}")
    return ["--config", str(stored), *args]


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return None


def prepare(rl: RLConfig) -> None:
    """Make `rl.output_dir` ready for this run (see the module's guarantee); ConfigError if it is not ours
    to use, saying what is there and what to do."""
    out = rl.output_dir
    if rl.clean and rl.resume:
        raise ConfigError(
            "--clean and --resume together: --clean deletes the run that --resume would continue; pass one"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a directory: choose another --output-dir")
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    make_private(out, rl.output_dir_group)
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        _claim(out)
        return
    if not layout.run_marker_file(out).is_file():
        if rl.resume and holds_a_run(out):  # a run from before rl left markers: continuing deletes nothing
            _claim(out)
            return
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ConfigError(
            f"output_dir {out} holds files rl did not write ({shown}; no {MARKER}): rl neither reuses nor deletes "
            "them; choose another --output-dir"
        )
    if rl.resume:
        if not holds_a_run(out):
            raise ConfigError(f"--resume: output_dir {out} holds no published step to continue from; drop --resume")
        return
    if not holds_a_run(out):
        logger.info(f"output_dir {out}: an earlier start published nothing; starting afresh in it")
        _remove_run_entries(out)
        return
    if not rl.clean:
        raise ConfigError(
            f"output_dir {out} holds an earlier run: pass --resume to continue it or --clean to start over"
        )
    _refuse_dangerous(out)
    _remove_run_entries(out)
    left = sorted(set(entries) - set(RUN_ENTRIES) - {MARKER})
    if left:
        logger.warning(f"--clean left what rl did not write in {out}: {', '.join(left)}")


def make_private(out: Path, group: str | None = None) -> None:
    """Give `out` mode 0700, or 0750 with `group` (set-group-id, so what is written in it stays in
    that group); ConfigError if another user owns it (they could read or replace what the run writes)."""
    refuse_foreign_owner(out)
    if group is not None:
        try:
            shutil.chown(out, group=group)
        except (LookupError, PermissionError) as e:
            raise ConfigError(f"output_dir_group = {group!r}: cannot give {out} to that group ({e})") from None
    os.chmod(out, 0o2750 if group is not None else 0o700)


def holds_a_run(out: Path) -> bool:
    """True once a run in `out` published anything: a batch, a checkpoint, a rollout or a metric."""
    published = layout.published_steps(layout.rollouts_root(out)) or layout.published_steps(
        layout.checkpoints_root(out)
    )
    files = (layout.train_rollouts_file(out), layout.metrics_file(out))
    return bool(published) or any(f.is_file() and f.stat().st_size > 0 for f in files)


def write_user_config(rl: RLConfig) -> None:
    """Keep the keys the user set (without the one-off `resume`/`clean`) for `rl --resume --output-dir`:
    defaults stay defaults, and keys `rl` shares into every section stay at the top level."""
    path = user_config_file(rl.output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = rl.model_copy()
    kept.__pydantic_fields_set__ = rl.model_fields_set - {"resume", "clean"}
    path.write_text(config_to_toml(kept, only_set=True))


def _claim(out: Path) -> None:
    marker = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "envrl": version("envrl"), "pid": os.getpid()}
    layout.run_marker_file(out).write_text(json.dumps(marker) + "\n")


def _refuse_dangerous(out: Path) -> None:
    """Never clean the working directory, home, `/`, or a directory holding either of them."""
    target = out.resolve()
    for protected in (Path.cwd().resolve(), Path.home().resolve(), Path("/")):
        if target == protected or target in protected.parents:
            raise ConfigError(
                f"--clean refuses output_dir {out}: it is or holds {protected}; choose another --output-dir"
            )


def _remove_run_entries(out: Path) -> None:
    for name in RUN_ENTRIES:
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
