"""Batches are deleted only when no resume can read them again; disk use is measured."""

from pathlib import Path

from envrl.data.layout import batch_dir, checkpoint_dir, published_steps, rollouts_root
from envrl.orchestrator.retention import disk_use, prune_batches


def make_run(out: Path, batches: range, checkpoints: list[int]) -> None:
    for step in batches:
        batch_dir(out, step).mkdir(parents=True)
        (batch_dir(out, step) / "batch.bin").write_bytes(b"x" * 1000)
    for step in checkpoints:
        checkpoint_dir(out, step).mkdir(parents=True)


def test_batches_before_the_oldest_checkpoint_are_deleted_and_the_rest_kept(tmp_path: Path) -> None:
    make_run(tmp_path, range(25), checkpoints=[10, 20])
    assert prune_batches(tmp_path) == list(range(10))
    assert published_steps(rollouts_root(tmp_path)) == list(range(10, 25))
    assert prune_batches(tmp_path) == []


def test_without_a_checkpoint_every_batch_is_kept(tmp_path: Path) -> None:
    make_run(tmp_path, range(5), checkpoints=[])
    assert prune_batches(tmp_path) == []
    assert published_steps(rollouts_root(tmp_path)) == list(range(5))


def test_the_newest_batch_is_kept_even_behind_a_newer_checkpoint(tmp_path: Path) -> None:
    # The trainer checkpointed step 8 while the orchestrator's newest batch is 5 (a standalone
    # orchestrator pointed at an older trainer's dir): its resume state lives in batch 5.
    make_run(tmp_path, range(6), checkpoints=[8])
    assert prune_batches(tmp_path) == list(range(5))
    assert published_steps(rollouts_root(tmp_path)) == [5]


def test_disk_use_counts_the_run_files_and_not_what_links_point_at(tmp_path: Path) -> None:
    out = tmp_path / "run"
    make_run(out, range(3), checkpoints=[])
    big = tmp_path / "outside.bin"
    big.write_bytes(b"y" * 100_000)
    (out / "link").symlink_to(big)
    use = disk_use(out)
    assert use.run_bytes == 3000
    assert use.free_bytes > 0
    assert "disk" in use.describe()
