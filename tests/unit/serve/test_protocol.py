"""Request parsing: every way a frame can be wrong maps to one typed error, with the id when known."""

import msgpack
import pytest

from envrl.serve import protocol as p


def parse(message: object, limit: int = 1 << 20) -> tuple[str, str, dict]:
    return p.parse_request(msgpack.packb(message), limit)


def error_of(frame: bytes, limit: int = 1 << 20) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as raised:
        p.parse_request(frame, limit)
    return raised.value


def test_a_well_formed_request_parses_and_params_default_to_empty() -> None:
    assert parse({"id": "1", "method": "health"}) == ("1", "health", {})
    assert parse({"id": "2", "method": "cancel", "params": {"request_id": "1"}}) == ("2", "cancel", {"request_id": "1"})


@pytest.mark.parametrize(
    ("frame", "error_type", "request_id"),
    [
        (b"\xc1", p.BAD_REQUEST, None),
        (msgpack.packb(["id", "health"]), p.BAD_REQUEST, None),
        (msgpack.packb({"method": "health"}), p.BAD_REQUEST, None),
        (msgpack.packb({"id": "a", "method": 3}), p.BAD_REQUEST, "a"),
        (msgpack.packb({"id": "b", "method": "info", "params": [1]}), p.BAD_REQUEST, "b"),
        (msgpack.packb({"id": "c", "method": "info", "extra": 1}), p.BAD_REQUEST, "c"),
        (msgpack.packb({"id": "d", "method": "reboot"}), p.UNKNOWN_METHOD, "d"),
    ],
)
def test_malformed_requests_raise_typed_errors_keeping_the_id_when_readable(
    frame: bytes, error_type: str, request_id: str | None
) -> None:
    error = error_of(frame)
    assert (error.type, error.request_id) == (error_type, request_id)


def test_an_oversized_frame_is_refused_before_it_is_decoded() -> None:
    error = error_of(msgpack.packb({"id": "x", "method": "health", "params": {"pad": "y" * 2000}}), limit=1024)
    assert error.type == p.TOO_LARGE and "1024" in error.message


def test_an_unknown_method_error_lists_the_methods() -> None:
    assert all(method in error_of(msgpack.packb({"id": "d", "method": "reboot"})).message for method in p.METHODS)


def test_responses_are_single_msgpack_maps() -> None:
    assert msgpack.unpackb(p.ok_response("7", {"status": "ok"})) == {"id": "7", "ok": True, "result": {"status": "ok"}}
    error = msgpack.unpackb(p.error_response(None, p.TOO_LARGE, "big"))
    assert error == {"id": None, "ok": False, "error": {"type": "too_large", "message": "big"}}


def test_group_seed_overrides_the_sampling_seed() -> None:
    params = p.GroupParams.model_validate(
        {"task_idx": 0, "n": 2, "client": {"type": "scripted"}, "sampling": {"max_tokens": 4, "seed": 1}, "seed": 9}
    )
    assert params.sampling_args().seed == 9 and params.split == "train"
