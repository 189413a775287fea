"""Guarantee: inside `one_line_errors`, a `ConfigError` or an error kind the command names (a
wiring mistake: another model client, no answer, a missing model) exits 2 with ONE line on
stderr saying what, where and how to fix; anything else, a bug, keeps its traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from envrl.config import ConfigError

CONFIG_ERROR_EXIT = 2
"""Exit code of a command stopped by a config or wiring mistake (a supervisor does not restart it:
the same config would fail the same way)."""


def exit_with(prog: str, error: BaseException | str) -> NoReturn:
    """Print `prog: error: ...` as one line on stderr and exit `CONFIG_ERROR_EXIT`."""
    line = " ".join(str(error).split())
    print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(CONFIG_ERROR_EXIT)


@contextmanager
def one_line_errors(prog: str, *expected: type[BaseException]) -> Iterator[None]:
    """Run the block; a `ConfigError` or an `expected` error ends the process through `exit_with`."""
    try:
        yield
    except (ConfigError, *expected) as e:
        exit_with(prog, e)


def check_model(name: str, key: str = "model.name") -> None:
    """`name` (config key `key`) is a local HF model directory, or a hub id (`org/name`) that may be
    downloaded or is cached; else a `ConfigError` saying which."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key} {name!r}: {path} has no config.json, so it is not an HF model directory")
        return
    looks_like_a_path = name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_like_a_path:
        raise ConfigError(
            f"{key} {name!r}: no such directory (working directory {Path.cwd()}), and not a hub id "
            "(org/name); check the path, or build the model first (README: The tiny model)"
        )
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not _cached(name):
        raise ConfigError(f"{key} {name!r}: not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it")


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache  # installed with transformers; only needed here

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
