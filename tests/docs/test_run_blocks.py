"""Every `run` block of README.md and docs/*.md runs as written and does what its page says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import Block, all_blocks
from tests.docs.runner import outcome_problems, run_block, scratch_checkout

RUN = [block for block in all_blocks() if block.kind == "run"]


@pytest.mark.parametrize("block", RUN, ids=[block.where for block in RUN])
def test_the_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    where = scratch_checkout(tmp_path / "checkout")
    if block.options.get("after") == "previous":  # a block that needs what the one before it made
        before = [b for b in RUN if b.page == block.page and b.line < block.line][-1]
        first = run_block(before, where)
        assert not outcome_problems(before, first), (
            f"{before.where}, which {block.where} needs, failed:\n{first.output[-2000:]}"
        )
    ran = run_block(block, where)
    wrong = outcome_problems(block, ran)
    assert not wrong, f"{block.where}: {'; '.join(wrong)}; last output:\n{ran.output[-3000:]}"
