"""Env server wire protocol 3: one msgpack map per ZMQ frame, built and validated through these models once;
anything else a client sends gets a typed error, never a dead server (prose: docs/protocol.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from envrl.data.traces import Split, Trace
from envrl.model.client import ClientConfig, EvalClientConfig, SamplingArgs, TrainClientConfig

PROTOCOL_VERSION = 3


ErrorType = Literal[
    "bad_request",
    "unknown_method",
    "too_large",
    "at_capacity",
    "cancelled",
    "shutting_down",
    "internal_error",
]
"""The `error.type` of a response with ok = false, in protocol v3."""
BAD_REQUEST: ErrorType = "bad_request"  # not msgpack, not a map, a missing or mistyped field, a bad task index
UNKNOWN_METHOD: ErrorType = "unknown_method"
TOO_LARGE: ErrorType = "too_large"  # frame over the server's max_frame_bytes
AT_CAPACITY: ErrorType = "at_capacity"  # every worker slot busy and the wait queue full: back off and retry
CANCELLED: ErrorType = "cancelled"  # the request was cancelled by a `cancel` call
SHUTTING_DOWN: ErrorType = "shutting_down"  # the server is draining (SIGTERM) and takes no new rollouts
INTERNAL_ERROR: ErrorType = "internal_error"  # handling it failed in the server or a worker (a bug: see the log)

# Error Trace types (a `run` result whose trace has `error.type` set by the server, not the env).
TIMEOUT = "timeout"  # the rollout ran past timeout.rollout_s
WORKER_DIED = "worker_died"  # its worker process died while running it, and again on each re-run
UNENCODABLE = "unencodable_trace"  # the env returned a Trace msgpack cannot carry (a set, a datetime, ...)

Method = Literal["health", "info", "run", "cancel"]
METHODS: tuple[Method, ...] = get_args(Method)
REMOVED_METHODS = {"bind": "the model client is the server's config since protocol 3; start it with --client"}
"""Methods of earlier versions, answered `bad_request` with what took their place."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestMessage(_Wire):
    """A request frame's map."""

    id: str
    """Chosen by the client; unique among its connection's requests in flight."""
    method: Method
    params: dict[str, Any] = {}
    """Checked per method (`RunParams`, `CancelParams`) by `ParamsChecker`."""


REQUEST_KEYS = frozenset(RequestMessage.model_fields)


class RunParams(_Wire):
    """`params` of `run`: `n` rollouts of one task with the server's model client, scored together
    (n = 1: one rollout)."""

    task_idx: int = Field(ge=0, strict=True)
    split: Split = "train"
    n: int = Field(1, ge=1, strict=True)
    sampling: SamplingArgs
    seed: int | None = Field(None, strict=True)
    """Overrides `sampling.seed` when given; rollout i of the group samples with seed + i."""


class CancelParams(_Wire):
    request_id: str
    """The `id` of an earlier request on the same connection."""


class HealthResult(_Wire):
    status: Literal["ok", "starting", "draining"]
    """ok: at least one worker is ready; starting: none yet; draining: SIGTERM received."""
    workers: int


class ClientInfo(_Wire):
    """A model client as `info` shows it: what it reaches, never a secret (no API key variable,
    no extra body, no scripted replies). Two clients with equal infos feed a run the same model."""

    type: str
    base_urls: list[str]
    """The model servers it calls (a train client's replicas; none for a scripted client)."""
    model: str | None
    tokenizer: str | None
    """The tokenizer it renders with (a train client's `tokenizer`, else its `model`)."""

    @classmethod
    def of(cls, client: ClientConfig) -> ClientInfo:
        """`client`'s info, comparable wherever it is made: URLs without a trailing '/', a local
        model or tokenizer directory as its absolute path."""
        if isinstance(client, TrainClientConfig):
            return cls(
                type=client.type,
                base_urls=[url.rstrip("/") for url in client.base_urls],
                model=_absolute(client.model),
                tokenizer=_absolute(client.tokenizer or client.model),
            )
        if isinstance(client, EvalClientConfig):
            return cls(type=client.type, base_urls=[client.base_url.rstrip("/")], model=client.model, tokenizer=None)
        return cls(type=client.type, base_urls=[], model=None, tokenizer=_absolute(client.tokenizer))

    def __str__(self) -> str:
        fields = [
            self.type,
            *self.base_urls,
            *(f"{key} {value!r}" for key in ("model", "tokenizer") if (value := getattr(self, key))),
        ]
        return " ".join(fields)


def _absolute(name: str | None) -> str | None:
    """`name` resolved if it is an existing local path (a directory the client loads), else as given (a hub name)."""
    try:
        return str(Path(name).resolve()) if name is not None and Path(name).exists() else name
    except (OSError, ValueError):  # a name no file system could hold: not a local path
        return name


class ServerInfo(_Wire):
    protocol_version: int
    env_id: str
    num_tasks: int
    num_eval_tasks: int
    group_scoring: bool
    workers: int
    """Live worker processes that are ready."""
    in_flight: int
    """Rollout requests running in workers."""
    capacity: int
    """Most requests the pool runs at once at full size (workers x multiplex)."""
    queued: int
    """Requests waiting for a worker slot."""
    max_queued: int
    """Queue bound; beyond capacity + max_queued, requests get `at_capacity`."""
    client: ClientInfo | None
    """The server's model client (`--client`), without secrets; None: it runs no rollouts."""


class CancelResult(_Wire):
    cancelled: bool
    """True if the request was still queued or running (it is then answered `cancelled`)."""


class RunResult(_Wire):
    """The result of `run`: one Trace per rollout asked for, in order."""

    traces: list[Trace]


Result = RunResult | HealthResult | ServerInfo | CancelResult


class OkResponse(_Wire):
    id: str
    ok: Literal[True] = True
    result: Any
    """The method's result model (`Result`) as a map; the caller validates it into its method's
    model, so the envelope decodes without knowing the method."""


class ErrorInfo(_Wire):
    type: ErrorType
    message: str
    """What was wrong, where, and what to do about it."""


class ErrorResponse(_Wire):
    id: str | None
    """None when the request's id could not be read."""
    ok: Literal[False] = False
    error: ErrorInfo


Response = OkResponse | ErrorResponse
_RESPONSE: TypeAdapter[Response] = TypeAdapter(Response)


class ProtocolError(Exception):
    """A request the server cannot take; answered as an error response with `type`."""

    def __init__(self, type: ErrorType, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.request_id = request_id


_packer = msgpack.Packer(use_bin_type=True)
"""Reused: `msgpack.packb` builds a Packer (and its buffer) per call, which every small frame would pay again.
`pack` runs in C without releasing the GIL, so threads sharing it cannot interleave."""


def encode(message: Any) -> bytes:
    return _packer.pack(message)


def decode(frame: bytes) -> Any:
    return msgpack.unpackb(frame, raw=False)


def ok_response(request_id: str, result: Result) -> bytes:
    return encode(OkResponse(id=request_id, result=result).model_dump())


def error_response(request_id: str | None, type: ErrorType, message: str) -> bytes:
    return encode(ErrorResponse(id=request_id, error=ErrorInfo(type=type, message=message)).model_dump())


def decode_response(frame: bytes) -> Response:
    """The response in a frame; raises (msgpack or pydantic errors) when it holds none."""
    return _RESPONSE.validate_python(decode(frame))


MAX_CONTAINER_ITEMS = 65536
"""Most entries of one array or map in a request (a request's lists are short: stop strings,
replica URLs); with the frame limit it bounds what decoding a hostile frame can allocate."""


BIN_TYPE_BYTES = (b"\xc4", b"\xc5", b"\xc6")
"""msgpack's bin 8/16/32 type bytes: a frame holding none of them decodes to no `bytes` object."""


def decode_request(frame: bytes, *, strict_map_key: bool) -> Any:
    """A request frame's msgpack, decoded with bounded container sizes. `strict_map_key`: msgpack
    refuses (ValueError) any map key that is neither `str` nor `bytes`; without it keys of any type
    are decoded (for `parse_request` to name the bad key under the request's id)."""
    return msgpack.unpackb(
        frame,
        raw=False,
        strict_map_key=strict_map_key,
        max_array_len=MAX_CONTAINER_ITEMS,
        max_map_len=MAX_CONTAINER_ITEMS,
    )


def _salvaged_id(frame: bytes) -> str | None:
    """The string `id` of a top-level map whose other entries do not decode (an array as a map
    key, a container over the limits): read entry by entry, skipping the others unbuilt."""
    unpacker = msgpack.Unpacker(raw=False, max_array_len=MAX_CONTAINER_ITEMS, max_map_len=MAX_CONTAINER_ITEMS)
    unpacker.feed(frame)
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "id":
                value = unpacker.unpack()
                return value if isinstance(value, str) else None
            unpacker.skip()
    except Exception:  # noqa: BLE001 - nothing readable: the answer goes out without an id
        return None
    return None


MAX_WALKED_VALUES = MAX_CONTAINER_ITEMS
"""Most values the map-key check walks in one request (only frames with a bin type byte or a
non-string key are walked); a request holding more is refused, whatever the frame limit."""


def _non_string_key(value: Any, path: str) -> str | None:
    """The path of the first map key in `value` that is not a string (None: there is none), or
    the reason the walk stopped at `MAX_WALKED_VALUES` values."""
    stack: list[tuple[Any, str, Any]] = [(value, path, None)]  # (value, its container's path, its key or index)
    walked = 0
    while stack:
        item, parent, step = stack.pop()
        walked += 1
        if walked > MAX_WALKED_VALUES:
            return f"{path} holds more than {MAX_WALKED_VALUES} values (not checked)"
        where = parent if step is None else f"{parent}[{step}]" if isinstance(step, int) else f"{parent}.{step}"
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return f"{where}: key {key!r} ({type(key).__name__})"
            stack.extend((child, where, key) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, where, i) for i, child in reversed(list(enumerate(item))))
    return None


def parse_request(frame: bytes, max_frame_bytes: int) -> RequestMessage:
    """The request in a frame, or ProtocolError saying what is wrong with it (with the request's
    id whenever the frame is a map holding a string `id`)."""
    if len(frame) > max_frame_bytes:
        raise ProtocolError(TOO_LARGE, f"frame of {len(frame)} bytes is over the server's limit of {max_frame_bytes}")
    try:  # the common frame: its keys are str or bytes (msgpack checks), and bytes only with a bin byte
        message = decode_request(frame, strict_map_key=True)
        keys_unchecked = any(marker in frame for marker in BIN_TYPE_BYTES)
    except Exception:  # a non-string key, or bad input (msgpack raises several unrelated types)
        try:
            message = decode_request(frame, strict_map_key=False)
        except Exception as e:
            message = f"frame is not valid msgpack ({type(e).__name__}: {e})"
            raise ProtocolError(BAD_REQUEST, message, _salvaged_id(frame)) from None
        keys_unchecked = True
    if not isinstance(message, dict):
        raise ProtocolError(BAD_REQUEST, f"a request is a msgpack map, got {type(message).__name__}")
    request_id = message.get("id")
    if not isinstance(request_id, str):
        raise ProtocolError(BAD_REQUEST, f"request 'id' must be a string, got {type(request_id).__name__}")
    bad_key = _non_string_key(message, "request") if keys_unchecked else None
    if bad_key is not None:
        raise ProtocolError(BAD_REQUEST, f"map keys must be strings: {bad_key}", request_id)
    method, params = message.get("method"), message.get("params", {})
    if not isinstance(method, str):
        raise ProtocolError(BAD_REQUEST, f"request 'method' must be a string, got {type(method).__name__}", request_id)
    if not isinstance(params, dict):
        raise ProtocolError(BAD_REQUEST, f"request 'params' must be a map, got {type(params).__name__}", request_id)
    if not message.keys() <= REQUEST_KEYS:
        extra = sorted(str(key) for key in message.keys() - REQUEST_KEYS)
        raise ProtocolError(BAD_REQUEST, f"unknown request keys {extra}; a request has id, method, params", request_id)
    if method in REMOVED_METHODS:
        raise ProtocolError(BAD_REQUEST, f"{method}: {REMOVED_METHODS[method]}", request_id)
    if method not in METHODS:
        raise ProtocolError(UNKNOWN_METHOD, f"unknown method {method!r}; methods: {', '.join(METHODS)}", request_id)
    return RequestMessage.model_validate(message)


def readable_id(frame: bytes, max_frame_bytes: int) -> str | None:
    """The string `id` of a frame that holds a request map, if it has one (for errors about the rest)."""
    try:
        return parse_request(frame, max_frame_bytes).id
    except ProtocolError as e:
        return e.request_id


def validation_message(error: Exception) -> str:
    """A pydantic ValidationError as one line: `params.<field>: <problem>` for the first problem."""
    errors = getattr(error, "errors", None)
    if errors is None:
        return str(error)
    first = errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    return f"params.{loc}: {first['msg']}" + (f" ({len(errors())} problems)" if len(errors()) > 1 else "")


# ---------------------------------------------------------------------------------------------
# Internal: server <-> worker framing over the pool's ipc ROUTER/DEALER (not the client protocol).
#
# server -> worker: [header, frame, ...]; header = msgpack list of [op, arg] pairs, and each
#   "client" and "run" op consumes the next frame:
#   [OP_CLIENT, 0] + the server's model client config (msgpack map, from its validated config),
#     sent once, when the worker reports ready, so before its first run op;
#   [OP_RUN, token] + a `Work` frame (`encode_work`): the accepted request, re-encoded;
#   [OP_CANCEL, token]; [OP_STOP, 0].
# worker -> server: [WORKER_READY] once, then [WORKER_DONE, msgpack list of tokens, response, ...]
#   where each response is the finished client-bound frame for that token.

OP_RUN = "run"
OP_CLIENT = "client"
OP_CANCEL = "cancel"
OP_STOP = "stop"
WORKER_READY = b"ready"
WORKER_DONE = b"done"


class Work(NamedTuple):
    """A `run` request as the server accepted it: what a worker needs, nothing it must check."""

    request_id: str
    split: Split
    task_idx: int
    n: int
    sampling: SamplingArgs
    """With the request's `seed` applied."""


def encode_work(request_id: str, params: RunParams) -> bytes:
    """The worker's frame of an accepted `run` request (validated values, not the client's bytes)."""
    sampling = params.sampling.model_dump()
    if params.seed is not None:
        sampling["seed"] = params.seed
    return encode([request_id, params.split, params.task_idx, params.n, sampling])


def decode_work(frame: bytes) -> Work:
    """A frame `encode_work` made. Not validated again: the server built it from a validated
    `RunParams` (`model_construct` takes the dumped fields as they are)."""
    request_id, split, task_idx, n, sampling = decode(frame)
    return Work(request_id, split, task_idx, n, SamplingArgs.model_construct(**sampling))
