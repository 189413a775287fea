"""ModelRegistry: a bound client keeps one id; the least recently used idle binding makes room."""

import pytest

from envrl.model.client import ScriptedClientConfig
from envrl.serve import protocol as p
from envrl.serve.models import ModelRegistry


def scripted(reply: str) -> ScriptedClientConfig:
    return ScriptedClientConfig(replies=[reply])


def test_equal_clients_share_one_id_and_distinct_ones_get_their_own() -> None:
    models = ModelRegistry()
    (a, _), (again, _), (b, _) = (models.bind(c, "r") for c in (scripted("a"), scripted("a"), scripted("b")))
    assert a is again and a.id != b.id and models.get(b.id, "r") is b


def test_an_unknown_id_is_unknown_model() -> None:
    with pytest.raises(p.ProtocolError) as raised:
        ModelRegistry().get("0123456789abcdef", "r7")
    assert (raised.value.type, raised.value.request_id) == (p.UNKNOWN_MODEL, "r7")


def test_a_full_registry_drops_the_least_recently_used_idle_binding_and_never_one_in_use() -> None:
    models = ModelRegistry(limit=2)
    (busy, _), (idle, _) = models.bind(scripted("busy"), "r"), models.bind(scripted("idle"), "r")
    busy.requests = 1
    models.get(idle.id, "r")  # most recently used, but idle: still the one to go
    new, dropped = models.bind(scripted("new"), "r")
    assert dropped == [idle] and set(models.by_id) == {busy.id, new.id}
    new.requests = 1
    with pytest.raises(p.ProtocolError) as raised:
        models.bind(scripted("one more"), "r")
    assert raised.value.type == p.AT_CAPACITY
