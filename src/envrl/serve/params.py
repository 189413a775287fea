"""Checking a request's params: one pydantic model per method, the env's task counts, the server's limits.

Guarantee: `ParamsChecker.rollout` returns params only when the method's model (`RolloutParams`,
`GroupParams`) accepts them, `task_idx` is in range for its split, `n` is at most `max_group_size`
and the client asks for nothing `model_access` does not allow; anything else raises
`ProtocolError(bad_request)` naming the field. The server and its workers both use it, so the
rules live here once; whatever a frame holds, it raises nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from envrl.envs.model_client import ClientConfig, SamplingArgs
from envrl.serve import protocol as p
from envrl.serve.config import ModelAccessConfig

MAX_CACHED = 256
"""Distinct `client`/`sampling` map pairs remembered as validated (a run sends a handful)."""
ROLLOUT_KEYS = frozenset(p.RolloutParams.model_fields)
GROUP_KEYS = frozenset(p.GroupParams.model_fields)
SPLITS = ("train", "eval")


class ParamsChecker:
    def __init__(self, num_tasks: Mapping[str, int], max_group_size: int, model_access: ModelAccessConfig) -> None:
        self.num_tasks = num_tasks
        self.max_group_size = max_group_size
        self.model_access = model_access
        self._parts: dict[tuple[str, str], tuple[ClientConfig, SamplingArgs]] = {}
        """Validated and allowed (client, sampling) by the repr of their maps, which tells apart every
        msgpack value (1, 1.0, True, "1")."""

    def cancel(self, params: dict[str, Any], request_id: str) -> p.CancelParams:
        try:
            return p.CancelParams.model_validate(params)
        except ValidationError as e:
            raise p.ProtocolError(p.BAD_REQUEST, f"cancel: {p.validation_message(e)}", request_id) from None

    def rollout(self, method: str, params: dict[str, Any], request_id: str) -> p.RolloutParams:
        """The params of a `run_rollout` (a RolloutParams) or `run_group` (a GroupParams) request."""
        group = method == "run_group"
        valid = self._known_parts(params, group)
        if valid is None:
            try:
                valid = (p.GroupParams if group else p.RolloutParams).model_validate(params)
            except ValidationError as e:
                raise p.ProtocolError(p.BAD_REQUEST, f"{method}: {p.validation_message(e)}", request_id) from None
            problem = self.model_access.problem(valid.client)
            if problem is not None:
                raise p.ProtocolError(p.BAD_REQUEST, f"{method}: {problem}", request_id)
            if len(self._parts) >= MAX_CACHED:
                self._parts.clear()
            self._parts[repr(params["client"]), repr(params["sampling"])] = (valid.client, valid.sampling)
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

    def _known_parts(self, params: dict[str, Any], group: bool) -> p.RolloutParams | None:
        """Params whose client and sampling maps validated before and whose scalars have the plain
        types the model would accept as they are, built without pydantic; else None (validate in full).
        Costs a few µs where full validation costs tens."""
        try:
            parts = self._parts.get((repr(params["client"]), repr(params["sampling"])))
        except KeyError:
            return None
        if parts is None:
            return None
        task_idx, split, seed = params.get("task_idx"), params.get("split", "train"), params.get("seed")
        n = params.get("n") if group else 1
        plain = (
            type(task_idx) is int and task_idx >= 0 and type(split) is str and split in SPLITS
            and (seed is None or type(seed) is int) and type(n) is int and n >= 1
            and params.keys() <= (GROUP_KEYS if group else ROLLOUT_KEYS)
        )  # fmt: skip
        if not plain:
            return None
        client, sampling = parts
        fields = {"task_idx": task_idx, "split": split, "client": client, "sampling": sampling, "seed": seed}
        return p.GroupParams.model_construct(n=n, **fields) if group else p.RolloutParams.model_construct(**fields)
