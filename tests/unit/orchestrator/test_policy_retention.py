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


class PublishedInMemory:
    """A `PolicyLoader` over a list: the tracker's only view of published policies and replicas."""

    def __init__(self, published: list[int]) -> None:
        self.steps = published
        self.loaded: list[int | str] = []

    def published(self) -> list[int]:
        return list(self.steps)

    def where(self, step: int) -> str:
        return f"policy {step}"

    async def load(self, step: int) -> None:
        self.loaded.append(step)

    async def load_base(self, model: str) -> bool:
        self.loaded.append(model)
        return True

    def discard(self, step: int) -> None:
        self.steps.remove(step)


def test_the_tracker_knows_the_policies_only_through_its_loader() -> None:
    loader = PublishedInMemory([0, 1, 2, 3])
    tracker = PolicyTracker(loader, max_async_level=1, timeout=5.0, keep=2)
    asyncio.run(tracker.ensure(4))
    assert (loader.loaded, tracker.current, loader.steps) == ([3], 3, [2, 3])
    starting = PublishedInMemory([0])
    asyncio.run(PolicyTracker(starting, max_async_level=1, timeout=5.0, keep=2).start_from("base"))
    assert starting.loaded == ["base"]
