"""Checking a request's params: one pydantic model per method, the env's task counts, the server's limits.

Guarantee: `ParamsChecker.rollout` returns params only when the method's model (`RolloutParams`,
`GroupParams`) accepts them, `task_idx` is in range for its split, `n` is at most `max_group_size`
and the client asks for nothing `model_access` does not allow; anything else raises
`ProtocolError(bad_request)` naming the field. The server checks every request here before it
reaches a worker; the worker only parses the forwarded map into the same model (which cannot
fail on a map accepted here) and checks no rule again, so the rules live here once; whatever a
frame holds, it raises nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from envrl.serve import protocol as p
from envrl.serve.config import ModelAccessConfig

MAX_CACHED = 256
"""Distinct `client` maps whose model_access verdict is remembered (a run sends a handful)."""


class ParamsChecker:
    def __init__(self, num_tasks: Mapping[str, int], max_group_size: int, model_access: ModelAccessConfig) -> None:
        self.num_tasks = num_tasks
        self.max_group_size = max_group_size
        self.model_access = model_access
        self._verdicts: dict[str, str | None] = {}
        """`model_access.problem` by the repr of the `client` map (which tells apart every msgpack
        value: 1, 1.0, True, "1"): it may look at the file system, validation does not."""

    def cancel(self, params: dict[str, Any], request_id: str) -> p.CancelParams:
        try:
            return p.CancelParams.model_validate(params)
        except ValidationError as e:
            raise p.ProtocolError(p.BAD_REQUEST, f"cancel: {p.validation_message(e)}", request_id) from None

    def rollout(self, method: str, params: dict[str, Any], request_id: str) -> p.RolloutParams:
        """The params of a `run_rollout` (a RolloutParams) or `run_group` (a GroupParams) request.
        Full pydantic validation: it cost no more than a hand-written fast path did
        (docs/measurements.md), so the rules stay in the one model."""
        try:
            valid = p.ROLLOUT_PARAMS[method].model_validate(params)
        except ValidationError as e:
            raise p.ProtocolError(p.BAD_REQUEST, f"{method}: {p.validation_message(e)}", request_id) from None
        key = repr(params["client"])
        if key not in self._verdicts:
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            self._verdicts[key] = self.model_access.problem(valid.client)
        problem = self._verdicts[key]
        if problem is not None:
            raise p.ProtocolError(p.BAD_REQUEST, f"{method}: {problem}", request_id)
        count = self.num_tasks[valid.split]
        if valid.task_idx >= count:
            raise p.ProtocolError(
                p.BAD_REQUEST,
                f"{method}: params.task_idx must be in 0..{count - 1} for split {valid.split!r}, got {valid.task_idx}",
                request_id,
            )
        if isinstance(valid, p.GroupParams) and valid.n > self.max_group_size:
            raise p.ProtocolError(
                p.BAD_REQUEST,
                f"{method}: params.n = {valid.n} is over this server's max_group_size ({self.max_group_size}); "
                "split the group or start the server with a larger --max-group-size",
                request_id,
            )
        return valid
