"""The env server's bound model clients: `bind` registers one, `run` requests name it by id.

Guarantee: an id names one client config, validated and allowed by `model_access` when it was
bound, until the server drops it; equal configs share one id. At most `limit` bindings are held:
binding one more drops the least recently used binding no booked request uses (the caller tells
the workers that built its client), and when every binding is in use the bind is refused
`at_capacity`. Ids are random, so an id kept from an earlier server at the same address never
names another client's binding here: it is `unknown_model`, and the client binds again.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass

from envrl.model.client import ClientConfig
from envrl.serve import protocol as p

MAX_MODELS = 64
"""Bindings one server holds (a run binds one client per env server; shared servers a few more)."""


@dataclass(eq=False, slots=True)
class Model:
    """One bound client config."""

    id: str
    frame: bytes
    """The validated config, msgpack: what a worker builds its client from (sent once per worker)."""
    requests: int = 0
    """Booked requests that use it (a binding in use is never dropped)."""


class ModelRegistry:
    def __init__(self, limit: int = MAX_MODELS) -> None:
        self.limit = limit
        self.by_id: OrderedDict[str, Model] = OrderedDict()
        """Least recently used first."""
        self.by_frame: dict[bytes, Model] = {}

    def bind(self, client: ClientConfig, request_id: str) -> tuple[Model, list[Model]]:
        """(the binding of `client`, the bindings dropped to make room for it)."""
        frame = p.encode(client.model_dump(mode="json"))
        model = self.by_frame.get(frame)
        if model is not None:
            self.by_id.move_to_end(model.id)
            return model, []
        dropped: list[Model] = []
        while len(self.by_id) >= self.limit:
            idle = next((m for m in self.by_id.values() if m.requests == 0), None)
            if idle is None:
                message = f"all {self.limit} bound models have rollouts running; back off and bind again"
                raise p.ProtocolError(p.AT_CAPACITY, message, request_id)
            del self.by_id[idle.id], self.by_frame[idle.frame]
            dropped.append(idle)
        model = Model(secrets.token_hex(8), frame)
        self.by_id[model.id] = self.by_frame[frame] = model
        return model, dropped

    def get(self, model_id: str, request_id: str) -> Model:
        """The binding `model_id` names, or `unknown_model`."""
        model = self.by_id.get(model_id)
        if model is None:
            message = f"run: params.model {model_id[:64]!r} is not bound on this server (restarted?); bind again"
            raise p.ProtocolError(p.UNKNOWN_MODEL, message, request_id)
        self.by_id.move_to_end(model_id)
        return model
