"""Several replicas called as one: a continued turn goes to the replica that answered it, others to the least busy;
a silent replica is skipped for `DOWN_S`; `update_weights` returns once all serve the new weights, or names those
that don't."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from envrl.model.inference import InferenceClient, InferenceError, TokenCompletion
from envrl.runtime.http import HttpCallError, RetryPolicy

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


DOWN_S = 10.0
"""Seconds a replica that did not answer is left out of the choice before it is tried again."""


ALL_DOWN_WAIT_S = 120.0
"""Seconds a call waits for some replica to answer again when none does (a replica restart takes
tens of seconds on CPU), before it fails."""


class ReplicaReloadError(InferenceError):
    """At least one replica did not load the new weights; the run cannot serve one policy."""

    def __init__(self, message: str, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered
        """Every failed replica failed by not answering (down or restarting), none refused."""


def _unanswered(error: BaseException) -> bool:
    """A call that failed because the server did not answer (or answered 5xx), not a refusal."""
    return isinstance(error, HttpCallError) and (error.status is None or error.status >= 500)


class InferenceReplicas:
    """`InferenceClient`s of the same model on every URL of `base_urls` (one per replica)."""

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        retry: RetryPolicy | None = None,
        reload_token: str | None = None,
        reload_in_flight: str = "wait",
    ) -> None:
        if not base_urls:
            raise ValueError("inference replicas: give at least one base_url")
        self.clients = [InferenceClient(url, model, retry=retry, reload_token=reload_token) for url in base_urls]
        self.reload_in_flight = reload_in_flight
        """What a reload does with the generations in flight on each replica (reload.IN_FLIGHT_PAUSE):
        "recompute" for partial rollouts, else "wait"."""
        self.wait_when_all_down = retry is None or retry.max_retries > 0
        """Whether a call waits for a replica while none answers (a caller allowing no retry fails fast)."""
        self.in_flight = [0] * len(self.clients)
        """Calls of this process each replica is answering now."""
        self._turns: OrderedDict[int, int] = OrderedDict()
        """Hash of a turn's prompt + completion ids -> the replica that generated it."""
        self._next = 0
        self._down_until = [0.0] * len(self.clients)
        """`time.monotonic()` until which each replica is left out (it did not answer)."""

    @property
    def base_urls(self) -> list[str]:
        return [client.base_url for client in self.clients]

    def pick(self, continues: Sequence[int] | None = None) -> int:
        """The replica for a call whose prompt extends the token ids `continues` (None: a first turn)."""
        now = time.monotonic()
        up = [i for i in range(len(self.clients)) if self._down_until[i] <= now] or list(range(len(self.clients)))
        if continues is not None and (known := self._turns.get(hash(tuple(continues)))) is not None and known in up:
            return known
        least = min(self.in_flight[i] for i in up)
        count = len(self.clients)
        for offset in range(count):
            index = (self._next + offset) % count
            if index in up and self.in_flight[index] == least:
                self._next = (index + 1) % count
                return index
        raise AssertionError("unreachable: some replica has the least in flight")

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, continues: Sequence[int] | None = None
    ) -> TokenCompletion:
        """`InferenceClient.generate` on the replica `pick(continues)` chooses; on another one
        while that one does not answer and another is up (see the module docstring)."""
        all_down_since: float | None = None
        while True:
            index = self.pick(continues)
            self.in_flight[index] += 1
            try:
                out = await self.clients[index].generate(prompt_ids, sampling)
                break
            except HttpCallError as e:
                if not _unanswered(e):
                    raise  # refused: the call's own fault, the same on every replica
                now = time.monotonic()
                self._down_until[index] = now + DOWN_S
                if all(until > now for until in self._down_until):
                    all_down_since = now if all_down_since is None else all_down_since
                    if not self.wait_when_all_down or now - all_down_since >= ALL_DOWN_WAIT_S:
                        raise
                    self._down_until = [now] * len(self.clients)  # try them all again
                    await asyncio.sleep(1.0)
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

    async def update_weights(
        self, path: str | Path, step: int | None = None, transfer: dict[str, Any] | None = None
    ) -> None:
        """Reload every replica at once; return when all serve the weights in `path` (`transfer`:
        the secret of a policy sent in memory)."""
        results = await asyncio.gather(
            *(
                client.update_weights(
                    path, step=step, replica=(i, len(self.clients)), in_flight=self.reload_in_flight, transfer=transfer
                )
                for i, client in enumerate(self.clients)
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        failed = [
            f"replica {index} ({client.base_url}): {result}"
            for index, (client, result) in enumerate(zip(self.clients, results, strict=True))
            if isinstance(result, BaseException)
        ]
        if failed:
            loaded = len(self.clients) - len(failed)
            raise ReplicaReloadError(
                f"weights {path} (policy {step}) did not load on {len(failed)} of {len(self.clients)} inference "
                f"replicas ({loaded} serve them now): " + "; ".join(failed) + "; see those replicas' logs",
                unanswered=all(_unanswered(e) for e in errors),
            )

    async def served_weights(self) -> list[str]:
        """Each replica's `InferenceClient.served_weights`, in replica order."""
        return list(await asyncio.gather(*(client.served_weights() for client in self.clients)))

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))
