"""Which published weight directories the orchestrator deletes once the replicas moved past them."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from envrl.data.layout import published_steps, weights_dir, weights_root
from envrl.orchestrator.policy import PolicyTracker
from envrl.transport.weights import ReplicaPolicyLoader


class ReloadsNothing:
    """Stands in for the inference replicas' reload (the retention rule is what is tested)."""

    clients = [SimpleNamespace()]

    async def update_weights(self, path: Any, step: int | None = None, transfer: Any = None) -> None:
        assert Path(path).is_dir()


def kept_after_serving(tmp_path: Path, newest: int, keep_every: int) -> list[int]:
    for step in range(newest + 1):
        weights_dir(tmp_path, step).mkdir(parents=True)
    loader = ReplicaPolicyLoader(ReloadsNothing(), tmp_path, timeout=5.0)  # type: ignore[arg-type]
    tracker = PolicyTracker(loader, max_async_level=1, timeout=5.0, keep=2, keep_every=keep_every)
    asyncio.run(tracker.ensure(newest))
    return published_steps(weights_root(tmp_path))


def test_weights_of_every_checkpoint_interval_are_kept_for_good(tmp_path: Path) -> None:
    assert kept_after_serving(tmp_path, newest=12, keep_every=5) == [0, 5, 10, 11, 12]


def test_without_an_interval_only_the_newest_are_kept(tmp_path: Path) -> None:
    assert kept_after_serving(tmp_path, newest=12, keep_every=0) == [11, 12]
