"""Several inference servers that serve one model and one policy, called as one.

Guarantee: a `generate` that continues a turn this set answered goes to the replica that answered
it (its prefix is in that replica's cache); any other goes to the replica with the fewest calls of
this process in flight (ties: in turn). `update_weights` reloads every replica in parallel and
returns only once all of them serve the new weights, or raises naming each replica (index and
URL) that did not.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from envrl.http import RetryPolicy
from envrl.inference.client import InferenceClient, InferenceError, TokenCompletion

REMEMBERED_TURNS = 4096
"""Turns whose replica is remembered for their continuation; older ones are forgotten (their
continuation is then balanced like a first turn), so memory stays bounded."""


def replica_urls(base_url: str | Sequence[str]) -> list[str]:
    """Every replica's URL of a `ReplicaUrls` value (a single server's URL as a one-item list)."""
    return [base_url] if isinstance(base_url, str) else list(base_url)


def _check_replica_urls(base_url: str | list[str]) -> str | list[str]:
    urls = replica_urls(base_url)
    if not urls:
        raise ValueError(
            "base_url is an empty list; give at least one inference server URL, e.g. "
            '"http://127.0.0.1:8000", or a list with one URL per replica'
        )
    blank = [i for i, url in enumerate(urls) if not url.strip()]
    if blank:
        raise ValueError(f"base_url has an empty URL (list index {blank}); give each replica's URL or remove the entry")
    return base_url


ReplicaUrls = Annotated[str | list[str], AfterValidator(_check_replica_urls)]
"""A config field naming one inference server by its URL, or a list of replicas that serve the
same model and policy; never empty (read it as a list with `replica_urls`)."""


class ReplicaReloadError(InferenceError):
    """At least one replica did not load the new weights; the run cannot serve one policy."""


class InferenceReplicas:
    """`InferenceClient`s of the same model on every URL of `base_urls` (one per replica)."""

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        retry: RetryPolicy | None = None,
        reload_token: str | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("inference replicas: give at least one base_url")
        self.clients = [InferenceClient(url, model, retry=retry, reload_token=reload_token) for url in base_urls]
        self.in_flight = [0] * len(self.clients)
        """Calls of this process each replica is answering now."""
        self._turns: OrderedDict[int, int] = OrderedDict()
        """Hash of a turn's prompt + completion ids -> the replica that generated it."""
        self._next = 0

    @property
    def base_urls(self) -> list[str]:
        return [client.base_url for client in self.clients]

    def pick(self, continues: Sequence[int] | None = None) -> int:
        """The replica for a call whose prompt extends the token ids `continues` (None: a first turn)."""
        if continues is not None and (known := self._turns.get(hash(tuple(continues)))) is not None:
            return known
        least = min(self.in_flight)
        count = len(self.clients)
        for offset in range(count):
            index = (self._next + offset) % count
            if self.in_flight[index] == least:
                self._next = (index + 1) % count
                return index
        raise AssertionError("unreachable: some replica has the least in flight")

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, continues: Sequence[int] | None = None
    ) -> TokenCompletion:
        """`InferenceClient.generate` on the replica `pick(continues)` chooses."""
        index = self.pick(continues)
        self.in_flight[index] += 1
        try:
            out = await self.clients[index].generate(prompt_ids, sampling)
        finally:
            self.in_flight[index] -= 1
        if len(self.clients) > 1:
            self._turns[hash((*prompt_ids, *out.completion_ids))] = index
            if len(self._turns) > REMEMBERED_TURNS:
                self._turns.popitem(last=False)
        return out

    async def wait_until_ready(self, timeout: float) -> None:
        """Every replica answers `GET /health` (each within `timeout` s)."""
        await asyncio.gather(*(client.wait_until_ready(timeout) for client in self.clients))

    async def update_weights(self, path: str | Path, step: int | None = None) -> None:
        """Reload every replica at once; return when all serve the weights in `path`."""
        results = await asyncio.gather(
            *(client.update_weights(path, step=step) for client in self.clients), return_exceptions=True
        )
        failed = [
            f"replica {index} ({client.base_url}): {result}"
            for index, (client, result) in enumerate(zip(self.clients, results, strict=True))
            if isinstance(result, BaseException)
        ]
        if failed:
            loaded = len(self.clients) - len(failed)
            raise ReplicaReloadError(
                f"weights {path} (policy {step}) did not load on {len(failed)} of {len(self.clients)} inference "
                f"replicas ({loaded} serve them now): " + "; ".join(failed) + "; see those replicas' logs"
            )

    async def served_weights(self) -> list[str]:
        """Each replica's `InferenceClient.served_weights`, in replica order."""
        return list(await asyncio.gather(*(client.served_weights() for client in self.clients)))

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))
