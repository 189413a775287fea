"""Checking a request's params: one pydantic model per method, the env's task counts, the server's limits.

Guarantee: `ParamsChecker.run` returns params only when `RunParams` accepts them, `task_idx` is
in range for its split and `n` is at most `max_group_size`; `ParamsChecker.bind` returns a
client only when `BindParams` accepts it and it asks for nothing `model_access` does not allow;
anything else raises `ProtocolError(bad_request)` naming the field. The server checks every
request here, before it reaches a worker, and nowhere else: workers get the accepted values
re-encoded (`protocol.encode_work`) and trust them. Whatever a frame holds, nothing else is raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from envrl.model.client import ClientConfig
from envrl.serve import protocol as p
from envrl.serve.config import ModelAccessConfig

M = TypeVar("M", p.CancelParams, p.BindParams, p.RunParams)


class ParamsChecker:
    def __init__(self, num_tasks: Mapping[str, int], max_group_size: int, model_access: ModelAccessConfig) -> None:
        self.num_tasks = num_tasks
        self.max_group_size = max_group_size
        self.model_access = model_access

    def cancel(self, params: dict[str, Any], request_id: str) -> p.CancelParams:
        return _validated(p.CancelParams, "cancel", params, request_id)

    def bind(self, params: dict[str, Any], request_id: str) -> ClientConfig:
        """The client of a `bind` request, once `model_access` allows everything it would reach."""
        client = _validated(p.BindParams, "bind", params, request_id).client
        problem = self.model_access.problem(client)
        if problem is not None:
            raise p.ProtocolError(p.BAD_REQUEST, f"bind: {problem}", request_id)
        return client

    def run(self, params: dict[str, Any], request_id: str) -> p.RunParams:
        """The params of a `run` request (its `model` is looked up by the server's `ModelRegistry`)."""
        valid = _validated(p.RunParams, "run", params, request_id)
        count = self.num_tasks[valid.split]
        if valid.task_idx >= count:
            raise p.ProtocolError(
                p.BAD_REQUEST,
                f"run: params.task_idx must be in 0..{count - 1} for split {valid.split!r}, got {valid.task_idx}",
                request_id,
            )
        if valid.n > self.max_group_size:
            raise p.ProtocolError(
                p.BAD_REQUEST,
                f"run: params.n = {valid.n} is over this server's max_group_size ({self.max_group_size}); "
                "split the group or start the server with a larger --max-group-size",
                request_id,
            )
        return valid


def _validated(model: type[M], method: str, params: dict[str, Any], request_id: str) -> M:
    try:
        return model.model_validate(params)
    except ValidationError as e:
        raise p.ProtocolError(p.BAD_REQUEST, f"{method}: {p.validation_message(e)}", request_id) from None
