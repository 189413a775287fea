"""The book of accepted rollout requests: each found by token and by unique (client, id) from `add` until `remove`,
its bytes counted exactly; `next_queued` yields queued requests oldest first, re-runs ahead."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from envrl.data.traces import Error, Trace
from envrl.envs.environment import Environment
from envrl.serve import protocol as p


@dataclass(eq=False, slots=True)
class Request:
    """A rollout request the server has accepted and must answer exactly once."""

    token: int
    identity: bytes
    request_id: str
    work: bytes
    """What its worker gets (`protocol.encode_work`), kept for re-runs."""
    split: str
    task_idx: int
    n: int
    attempts: int = 0
    """Re-runs after its worker died."""
    worker: int | None = None
    deadline: float | None = None
    cancel_requested: bool = False

    def error_answer(self, env: Environment, error: Error, **fields: Any) -> bytes:
        """The response that answers this request with n `error` Traces."""
        trace = Trace.from_error(env.get_task(self.split, self.task_idx), error, **fields)  # type: ignore[arg-type]
        return p.ok_response(self.request_id, p.RunResult(traces=[trace] * self.n))

    def set_deadline(self, deadline: float) -> None:
        """Keep the earlier of the two deadlines."""
        if self.deadline is None or deadline < self.deadline:
            self.deadline = deadline


class RequestBook:
    def __init__(self) -> None:
        self.by_token: dict[int, Request] = {}
        self.by_key: dict[tuple[bytes, str], int] = {}
        self.queue: deque[int] = deque()
        self.next_token = 0
        self.total_bytes = 0
        self.client_bytes: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.by_token)

    def add(self, identity: bytes, request_id: str, work: bytes, params: p.RunParams) -> Request:
        """Book a request (the caller checked `find` first: ids are unique per client)."""
        token, self.next_token = self.next_token, self.next_token + 1
        request = self.by_token[token] = Request(
            token, identity, request_id, work, params.split, params.task_idx, params.n
        )
        self.by_key[identity, request_id] = token
        self.total_bytes += len(work)
        self.client_bytes[identity] = self.client_bytes.get(identity, 0) + len(work)
        return request

    def find(self, identity: bytes, request_id: str) -> Request | None:
        token = self.by_key.get((identity, request_id))
        return None if token is None else self.by_token[token]

    def remove(self, request: Request) -> None:
        del self.by_token[request.token]
        del self.by_key[request.identity, request.request_id]
        self.total_bytes -= len(request.work)
        left = self.client_bytes.pop(request.identity) - len(request.work)
        if left:
            self.client_bytes[request.identity] = left

    def bytes_of(self, identity: bytes) -> int:
        """Bytes of the work frames this client's requests hold in the book."""
        return self.client_bytes.get(identity, 0)

    def of_client(self, identity: bytes) -> list[Request]:
        return [r for r in self.by_token.values() if r.identity == identity]

    def overdue(self, now: float) -> list[Request]:
        """Running requests past their deadline."""
        return [
            r for r in self.by_token.values() if r.worker is not None and r.deadline is not None and r.deadline <= now
        ]

    def enqueue(self, request: Request, first: bool = False) -> None:
        if first:
            self.queue.appendleft(request.token)
        else:
            self.queue.append(request.token)

    def peek_queued(self) -> Request | None:
        """The next queued request still in the book (answered ones, cancelled while queued, are skipped)."""
        while self.queue:
            request = self.by_token.get(self.queue[0])
            if request is not None:
                return request
            self.queue.popleft()
        return None

    def pop_queued(self) -> None:
        self.queue.popleft()

    def after_worker_death(
        self, tokens: set[int], max_reruns: int, draining: bool
    ) -> tuple[list[Request], list[tuple[Request, str]]]:
        """(re-run, [(failed, why not re-run)]): the requests a dead worker was running, each marked
        not running; re-runs are queued first. A request is re-run unless it was being cancelled,
        the server is draining, or it has already been re-run `max_reruns` times."""
        rerun: list[Request] = []
        failed: list[tuple[Request, str]] = []
        for token in sorted(tokens):
            request = self.by_token[token]
            request.worker, request.deadline = None, None
            if request.cancel_requested:
                failed.append((request, "it was being cancelled"))
            elif draining:
                failed.append((request, "the server is draining"))
            elif request.attempts >= max_reruns:
                failed.append(
                    (request, f"it had been re-run {request.attempts} times already, max_reruns = {max_reruns}")
                )
            else:
                request.attempts += 1
                rerun.append(request)
        for request in reversed(rerun):
            self.enqueue(request, first=True)
        return rerun, failed
