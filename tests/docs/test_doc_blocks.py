"""Every command block of README.md and docs/*.md is marked, locked, and covered by what it names."""

from __future__ import annotations

import json
import re

from tests.docs.blocks import LOCK, ROOT, all_blocks, digests, problems


def test_every_command_block_says_how_ci_treats_it() -> None:
    assert problems(all_blocks()) == []


def test_a_changed_command_fails_until_its_check_is_changed_too() -> None:
    locked, now = json.loads(LOCK.read_text()), digests(all_blocks())
    changed = sorted(page for page in {*locked, *now} if locked.get(page) != now.get(page))
    assert not changed, (
        f"command blocks changed in {changed}: make each block's marker (and the test it names) fit the new "
        "command, then `uv run --no-sync python -m tests.docs.blocks --update`"
    )


def test_a_covered_block_names_a_test_that_runs_its_configs_and_modules() -> None:
    for block in (b for b in all_blocks() if b.kind == "covered"):
        test = "\n".join((ROOT / path).read_text() for path in block.covered_by)
        names = [path.rsplit("/", 1)[-1] for path in re.findall(r"configs/\S+\.toml", block.text)]
        names += re.findall(r"-m (\S+)", block.text)
        missing = [name for name in names if name not in test]
        assert not missing, f"{block.where}: {block.options['by']} never mention {missing}"
