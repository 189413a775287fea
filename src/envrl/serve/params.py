"""`ParamsChecker.run` returns a request's params only when they validate, the task is in range and `n` fits;
anything else is `ProtocolError(bad_request)` naming the field. The one place requests are checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from envrl.serve import protocol as p

M = TypeVar("M", p.CancelParams, p.RunParams)

NO_CLIENT = (
    "run: this server has no model client, so it runs no rollouts; its owner starts it with "
    "--client '<ClientConfig map>' (docs/protocol.md)"
)


class ParamsChecker:
    def __init__(self, num_tasks: Mapping[str, int], max_group_size: int, has_client: bool) -> None:
        self.num_tasks = num_tasks
        self.max_group_size = max_group_size
        self.has_client = has_client

    def cancel(self, params: dict[str, Any], request_id: str) -> p.CancelParams:
        return _validated(p.CancelParams, "cancel", params, request_id)

    def run(self, params: dict[str, Any], request_id: str) -> p.RunParams:
        """The params of a `run` request, on a server that has a model client to run it with."""
        if not self.has_client:
            raise p.ProtocolError(p.BAD_REQUEST, NO_CLIENT, request_id)
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
