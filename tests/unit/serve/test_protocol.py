"""Request parsing: every way a frame can be wrong maps to one typed error, with the id when known;
responses built and read through the protocol's models."""

from pathlib import Path

import msgpack
import pytest
from pydantic import ValidationError

from envrl.data.traces import Error, Trace, WireTask
from envrl.model.client import EvalClientConfig, ScriptedClientConfig, TrainClientConfig
from envrl.serve import protocol as p
from envrl.serve.config import EnvServerConfig


def parse(message: object, limit: int = 1 << 20) -> p.RequestMessage:
    return p.parse_request(msgpack.packb(message), limit)


def error_of(frame: bytes, limit: int = 1 << 20) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as raised:
        p.parse_request(frame, limit)
    return raised.value


def test_a_well_formed_request_parses_and_params_default_to_empty() -> None:
    assert parse({"id": "1", "method": "health"}) == p.RequestMessage(id="1", method="health", params={})
    cancel = parse({"id": "2", "method": "cancel", "params": {"request_id": "1"}})
    assert (cancel.id, cancel.method, cancel.params) == ("2", "cancel", {"request_id": "1"})


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
        (msgpack.packb({"id": "e", "method": "run", "params": {"sampling": {1: 2}}}), p.BAD_REQUEST, "e"),
        (msgpack.packb({"id": "g", "method": "bind", "params": {"client": {"type": "scripted"}}}), p.BAD_REQUEST, "g"),
        (msgpack.packb({"id": "f", "method": "info", "params": {"x": [{"y": {(1, 2): 0}}]}}), p.BAD_REQUEST, "f"),
    ],
)
def test_malformed_requests_raise_typed_errors_keeping_the_id_when_readable(
    frame: bytes, error_type: str, request_id: str | None
) -> None:
    error = error_of(frame)
    assert (error.type, error.request_id) == (error_type, request_id)


def test_a_version_2_bind_is_refused_saying_where_the_client_went() -> None:
    error = error_of(msgpack.packb({"id": "b", "method": "bind", "params": {"client": {"type": "scripted"}}}))
    assert (error.type, error.request_id) == (p.BAD_REQUEST, "b")
    assert error.message == "bind: the model client is the server's config since protocol 3; start it with --client"


def test_client_info_shows_what_a_client_reaches_and_no_secret() -> None:
    train = TrainClientConfig(base_url=["http://a:8000", "http://b:8000"], model="m")
    assert p.ClientInfo.of(train) == p.ClientInfo(
        type="train", base_urls=["http://a:8000", "http://b:8000"], model="m", tokenizer="m"
    )
    chat = EvalClientConfig(base_url="http://c/v1", model="gpt", api_key_env="KEY", extra_body={"k": "secret"})
    shown = p.ClientInfo.of(chat)
    assert shown == p.ClientInfo(type="eval", base_urls=["http://c/v1"], model="gpt", tokenizer=None)
    assert "KEY" not in repr(shown) + str(shown) and "secret" not in repr(shown) + str(shown)
    assert p.ClientInfo.of(ScriptedClientConfig(replies=["x"], tokenizer="t")).tokenizer == "t"


def test_client_infos_compare_equal_wherever_they_are_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trailing '/' and a relative path to the same tokenizer directory name the same client."""
    (tmp_path / "tok").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = TrainClientConfig(base_url="http://a:8000/", model="tok")
    absolute = TrainClientConfig(base_url="http://a:8000", model=str(tmp_path / "tok"))
    assert p.ClientInfo.of(relative) == p.ClientInfo.of(absolute)
    assert p.ClientInfo.of(relative).tokenizer == str(tmp_path / "tok")
    assert p.ClientInfo.of(TrainClientConfig(base_url="http://a:8000", model="x" * 5000)).model == "x" * 5000


def test_a_non_string_map_key_is_named_by_its_path() -> None:
    error = error_of(msgpack.packb({"id": "e", "method": "run", "params": {"sampling": {"a": {7: 2}}}}))
    assert error.message == "map keys must be strings: request.params.sampling.a: key 7 (int)"


def test_a_bytes_map_key_is_refused_though_msgpack_s_strict_keys_let_it_through() -> None:
    """msgpack's `strict_map_key` refuses all keys but str and bytes; a bin key is named like the others."""
    error = error_of(msgpack.packb({"id": "e", "method": "run", "params": {"sampling": {b"a": 2}}}))
    assert (error.type, error.request_id) == (p.BAD_REQUEST, "e")
    assert error.message == "map keys must be strings: request.params.sampling: key b'a' (bytes)"


def test_a_request_whose_text_holds_bin_type_bytes_still_parses() -> None:
    """0xc4-0xc6 (msgpack's bin types) are also UTF-8 lead bytes: such text alone is no bytes key."""
    frame = msgpack.packb({"id": "Ąż", "method": "info", "params": {"Łódź": b"raw"}})
    assert p.parse_request(frame, 1 << 20).params == {"Łódź": b"raw"}


def test_a_container_longer_than_any_request_needs_is_refused_without_building_it() -> None:
    """An array header may claim far more items than the frame holds; decoding stops at the header."""
    frame = b"\x81\xa2id\xdd" + (p.MAX_CONTAINER_ITEMS + 1).to_bytes(4, "big") + b"\x90" * 100
    error = error_of(frame)
    assert error.type == p.BAD_REQUEST and "not valid msgpack" in error.message


def test_an_oversized_frame_is_refused_before_it_is_decoded() -> None:
    error = error_of(msgpack.packb({"id": "x", "method": "health", "params": {"pad": "y" * 2000}}), limit=1024)
    assert error.type == p.TOO_LARGE and "1024" in error.message


def empty_arrays(count: int, *, bin_byte: bool) -> bytes:
    """A request whose params hold `count` empty arrays (one Python list per byte), and a bin
    type byte in a string when `bin_byte` (which sends the frame through the map-key walk)."""
    pad = "\u0100" if bin_byte else "a"  # U+0100 is C4 80 in UTF-8: a bin 8 type byte
    head = msgpack.packb({"id": "bomb", "method": "health", "params": {pad: None}})[:-1]
    return head + b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


def test_a_frame_of_empty_arrays_at_the_old_limit_is_refused_by_the_default_limit_unread() -> None:
    default = EnvServerConfig(env={"id": "x"}).max_frame_bytes
    assert default <= 64 * 1024  # requests are KB; 1 MiB of empty arrays cost the broker 0.4-0.9 s
    error = error_of(empty_arrays(2**20 - 100, bin_byte=True), limit=default)
    assert error.type == p.TOO_LARGE and error.request_id is None  # refused on its length, never decoded


def test_the_map_key_walk_stops_at_its_budget_however_large_the_frame_limit() -> None:
    error = error_of(empty_arrays(p.MAX_WALKED_VALUES, bin_byte=True), limit=16 * 2**20)
    assert error.type == p.BAD_REQUEST and error.request_id == "bomb"
    assert f"more than {p.MAX_WALKED_VALUES} values" in error.message
    # the same frame without a bin byte is not walked: its keys are msgpack-checked strings
    assert p.parse_request(empty_arrays(p.MAX_WALKED_VALUES, bin_byte=False), 16 * 2**20).id == "bomb"


def test_an_unknown_method_error_lists_the_methods() -> None:
    assert all(method in error_of(msgpack.packb({"id": "d", "method": "reboot"})).message for method in p.METHODS)


def test_responses_are_single_msgpack_maps_in_the_documented_key_order() -> None:
    ok = p.ok_response("7", p.HealthResult(status="ok", workers=2))
    assert ok == msgpack.packb({"id": "7", "ok": True, "result": {"status": "ok", "workers": 2}})
    error = p.error_response(None, p.TOO_LARGE, "big")
    assert error == msgpack.packb({"id": None, "ok": False, "error": {"type": "too_large", "message": "big"}})


def test_responses_decode_into_their_models_and_results_into_the_methods_model() -> None:
    trace = Trace.from_error(WireTask(idx=3, prompt="x"), Error(type="timeout", message="slow"), is_truncated=True)
    ok = p.decode_response(p.ok_response("g", p.RunResult(traces=[trace, trace])))
    assert isinstance(ok, p.OkResponse) and p.RunResult.model_validate(ok.result).traces == [trace, trace]
    sent = msgpack.unpackb(p.ok_response("r", p.RunResult(traces=[trace])))["result"]
    assert sent == {"traces": [trace.to_wire()]}  # a Trace is sent as its wire map
    error = p.decode_response(p.error_response("e", p.AT_CAPACITY, "full"))
    assert isinstance(error, p.ErrorResponse) and (error.id, error.error.type) == ("e", "at_capacity")


def test_an_error_type_outside_the_protocol_is_refused_on_both_sides() -> None:
    with pytest.raises(ValidationError):
        p.error_response("1", "oops", "no such type")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        p.decode_response(msgpack.packb({"id": "1", "ok": False, "error": {"type": "oops", "message": "?"}}))


def test_a_worker_reads_back_exactly_the_values_the_server_accepted() -> None:
    """The work frame carries the validated values (the seed applied, defaults filled), not the
    client's bytes: a worker trusts it and checks nothing again."""
    params = p.RunParams.model_validate(
        {
            "task_idx": 2,
            "split": "eval",
            "n": 3,
            "sampling": {"max_tokens": 4, "seed": 1, "stop": ["x"]},
            "seed": 9,
        }
    )
    work = p.decode_work(p.encode_work("req", params))
    assert (work.request_id, work.split, work.task_idx, work.n) == ("req", "eval", 2, 3)
    assert work.sampling == params.sampling.model_copy(update={"seed": 9})  # the run's seed overrides sampling's
