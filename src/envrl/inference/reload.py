"""`POST /update_weights`: a reload completes (later requests use the new weights) or is refused with the old ones
serving, generation always resumed; serialised, idempotent per step, with a deadline; every token labelled with the
step that sampled it (docs/inference.md)."""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from loguru import logger
from pydantic import BaseModel, Field, ValidationError

from envrl.inference.adapter import PolicyAdapter, check_adapter
from envrl.inference.config import ReloadConfig
from envrl.inference.guard import guard
from envrl.inference.warmup import WARMUP_ENV, warm_up
from envrl.transport.digest import check_files_digest
from envrl.transport.files import Shapes, WeightsError, check_shapes, read_shapes, reload_files
from envrl.transport.memory import Joined, TransferSecret, check_receivable, join_sender, receive_policy
from envrl.transport.rendezvous import RendezvousError
from envrl.transport.source import AdapterWeights, FileWeights, MemoryWeights, WeightSource, read_source

PLUGIN_NAME = "envrl"
RELOAD_ENV = "ENVRL_INFERENCE_RELOAD"
"""Carries `inference.reload` (JSON) from the entry point to the plugin."""

InFlight = Literal["wait", "recompute", "keep"]
IN_FLIGHT_PAUSE: dict[str, tuple[str, bool]] = {
    "wait": ("wait", True),
    "recompute": ("keep", True),
    "keep": ("keep", False),
}
"""vLLM's `pause_generation(mode, clear_cache)` for each `in_flight` choice. `wait`: requests in
flight finish on the old weights before the load (it waits for the longest). `recompute`:
they are frozen in the scheduler, their KV cache dropped (vLLM preempts them), and after the
load they are prefilled again from prompt + tokens so far, so every later token is exactly the
new policy's sample. `keep`: frozen with their KV cache, so later tokens attend to keys and
values the old weights computed (a distribution of neither policy), and the prefix cache keeps
old-weight blocks that new requests may reuse; measured, not used by the orchestrator
(docs/scale.md)."""

UNLABELLED = "unlabelled"
"""Weight version of weights loaded without a policy step (vLLM labels those it started with "default")."""


class UpdateWeightsRequest(BaseModel):
    path: str
    """Directory of HF safetensors with the served model's architecture, or of a PEFT adapter."""
    step: int | None = Field(None, ge=0)
    """The policy step these weights are; a repeated POST of a loaded step is a no-op."""
    timeout_s: float | None = Field(None, gt=0)
    """A shorter deadline than the server's `inference.reload.timeout_s` for this call."""
    in_flight: InFlight = "wait"
    """What happens to generations running when the reload starts (see `IN_FLIGHT_PAUSE`)."""
    replica: int = Field(0, ge=0)
    replicas: int = Field(1, ge=1)
    """This server's index among the `replicas` loading `path` at once: for a policy sent in
    memory (`transfer.json`), its rank among the receivers and how many they are."""
    transfer: TransferSecret | None = None
    """For a policy sent in memory: its secret (the policy's `transfer.secret`), required then."""


MAX_BODY = 64 * 1024
"""Bytes of an `/update_weights` body read at most: a request names a directory, a step and a secret."""


async def _bounded_body(request: Request) -> bytes | None:
    """The request's body, or None once it (or its declared length) passes `MAX_BODY`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return None
    return bytes(body)


LOADED_WHAT = {
    FileWeights: "weights reloaded",
    AdapterWeights: "LoRA adapter hot-loaded",
    MemoryWeights: "weights received in memory",
}
"""How the log names a completed reload of each kind of `WeightSource`."""


class WeightReloadPlugin:
    """vLLM endpoint plugin adding `POST /update_weights` (see the module docstring)."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self._engine: Any = None
        self._served: Shapes = {}
        self._current = ""
        """The served policy: the adapter directory, or the full weights' directory."""
        self._base: WeightSource = FileWeights(Path(), {})
        """Where the full weights serving now came from (an adapter is applied on top of them)."""
        self._adapter: PolicyAdapter | None = None
        """Set when the server was started with LoRA (`enable_lora`)."""
        self._max_lora_rank = 0
        self._transfer_backend: str | None = None
        """The weight-transfer engine vLLM was started with (`weight_transfer_config`), if any."""
        self._tp_pp = 1
        """Workers of this replica (tensor x pipeline parallel): each is one receiver."""
        self._lock = asyncio.Lock()
        self._config = ReloadConfig()
        self._loaded: tuple[int, str, dict[str, Any]] | None = None
        """(step, path, answer) of the last reload that completed with a step."""

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter()
        router.add_api_route("/update_weights", self.update_weights, methods=["POST"])
        router.add_api_route("/weights", self.served_weights, methods=["GET"])
        app.include_router(router)
        guard(app)  # the API key on vLLM's unguarded routes too (envrl.inference.guard)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._engine = engine_client
        model = Path(args.model)
        self._current = str(model.resolve()) if model.is_dir() else str(args.model)
        self._served = read_shapes(model)
        self._base = FileWeights(Path(self._current), self._served)
        if (transfer := getattr(args, "weight_transfer_config", None)) is not None:
            self._transfer_backend = transfer.backend if hasattr(transfer, "backend") else transfer["backend"]
        self._tp_pp = args.tensor_parallel_size * args.pipeline_parallel_size
        if getattr(args, "enable_lora", False):
            models = state.openai_serving_models
            self._adapter = PolicyAdapter(engine_client, models, [p.name for p in models.base_model_paths])
            self._max_lora_rank = args.max_lora_rank
        if raw := os.environ.get(RELOAD_ENV):
            self._config = ReloadConfig.model_validate_json(raw)
        # vLLM calls this before its HTTP server accepts requests: the one hook where a warm-up
        # makes `/health` mean "serves at full speed" (see envrl.inference.warmup).
        await warm_up(engine_client, int(os.environ.get(WARMUP_ENV, "0")))

    async def served_weights(self) -> JSONResponse:
        """`GET /weights`: the directory the served weights came from, and their policy step if
        known, so a client can tell the weights of another run (or its own earlier steps) apart."""
        step = self._loaded[0] if self._loaded is not None and self._loaded[1] == self._current else None
        return JSONResponse({"path": self._current, "step": step})

    async def update_weights(self, raw: Request) -> JSONResponse:
        request = await self._admitted(raw)
        if isinstance(request, JSONResponse):
            return request
        path = Path(request.path).resolve()
        deadline = min(self._config.timeout_s, request.timeout_s or self._config.timeout_s)
        async with self._lock:
            if (repeated := self._repeated(request.step, path)) is not None:
                return repeated
            start = time.perf_counter()
            try:
                source = await asyncio.to_thread(read_source, path, request.step)
                joined = await asyncio.to_thread(self._check_and_join, source, request.transfer, deadline)
            except (WeightsError, RendezvousError) as e:
                logger.warning(f"weight reload refused: {e}")
                return JSONResponse({"error": f"{e}; the previous weights keep serving"}, status_code=400)
            try:
                failure, status = await self._reload(
                    source, deadline, (request.replica, request.replicas), request.in_flight, joined
                )
            finally:
                if joined is not None:
                    joined.store.close()
        if failure is not None:
            logger.error(failure)
            return JSONResponse({"error": failure}, status_code=status)
        seconds = time.perf_counter() - start
        answer = {"status": "ok", "path": str(path), "step": request.step, "seconds": seconds}
        if request.step is not None:
            self._loaded = (request.step, str(path), answer)
        logger.info(
            f"{LOADED_WHAT[type(source)]} from {path} in {seconds:.2f}s (requests in flight: {request.in_flight})"
        )
        return JSONResponse(answer)

    async def _admitted(self, raw: Request) -> UpdateWeightsRequest | JSONResponse:
        """The request, or the answer refusing it. The token is checked before the body is read, and the
        body is read only up to `MAX_BODY`: a caller without the token learns nothing of the schema
        and cannot make the server read much."""
        token = self._config.token()
        authorization = raw.headers.get("authorization", "")
        if token is not None and not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
            logger.warning("weight reload refused: missing or wrong token")
            return JSONResponse(
                {
                    "error": f"/update_weights needs 'Authorization: Bearer <token>' (the token in {self._config.token_env})"
                },
                status_code=401,
            )
        body = await _bounded_body(raw)
        if body is None:
            return JSONResponse({"error": f"/update_weights: body over {MAX_BODY} bytes"}, status_code=413)
        try:
            return UpdateWeightsRequest.model_validate_json(body)
        except ValidationError as e:
            return JSONResponse({"error": f"/update_weights: invalid body: {e}"}, status_code=422)

    def _repeated(self, step: int | None, path: Path) -> JSONResponse | None:
        """The answer to a POST of the step loaded last (the first answer again, or 409 for
        another directory); None for any other reload."""
        if self._loaded is None or step is None or self._loaded[0] != step:
            return None
        step, loaded_path, answer = self._loaded
        if loaded_path != str(path):
            return JSONResponse(
                {"error": f"policy step {step} was loaded from {loaded_path}, not {path}"}, status_code=409
            )
        logger.info(f"weight reload of step {step} asked again: already serving it")
        return JSONResponse(answer)

    def _check_and_join(self, source: WeightSource, transfer: TransferSecret | None, timeout_s: float) -> Joined | None:
        """WeightsError unless `source` can replace the served policy; for a policy sent in memory,
        its sender's rendezvous once the sender proved the secret (RendezvousError otherwise)."""
        match source:
            case FileWeights():
                check_shapes(source.shapes, self._served, str(source.path))
                check_files_digest(source.path)
            case AdapterWeights() if self._adapter is None:
                raise WeightsError(
                    f"{source.path} holds a LoRA adapter, but this server was started without LoRA; start it with "
                    "inference.vllm.enable_lora = true (`rl` does so when trainer.lora is set)"
                )
            case AdapterWeights():
                check_adapter(source, self._max_lora_rank)
            case MemoryWeights():
                check_receivable(source.path, source.info, self._transfer_backend, self._served)
                return join_sender(source.path, source.info, transfer, timeout_s)
        return None

    async def _reload(
        self,
        source: WeightSource,
        deadline: float,
        receivers: tuple[int, int],
        in_flight: InFlight,
        joined: Joined | None,
    ) -> tuple[str | None, int]:
        """Pause (as `in_flight` says), load `source` (restoring the old weights if that fails)
        and label what it generates from now on as its step, always resume; (failure, status)."""
        started = time.monotonic()
        mode, clear_cache = IN_FLIGHT_PAUSE[in_flight]
        try:
            try:
                await asyncio.wait_for(self._engine.pause_generation(mode=mode, clear_cache=clear_cache), deadline)
            except TimeoutError:
                return (
                    f"requests in flight did not finish within {deadline:g} s (inference.reload.timeout_s); reload of "
                    f"{source.path} abandoned, the previous weights from {self._current} keep serving; retry later",
                    503,
                )
            left = max(deadline - (time.monotonic() - started), 1e-3)
            try:
                failure = await asyncio.wait_for(self._load(source, receivers, joined), left)
            except TimeoutError:
                return (
                    f"loading {source.path} did not finish within the {deadline:g} s deadline "
                    "(inference.reload.timeout_s); which weights serve is unknown: restart the server",
                    500,
                )
            if failure is not None:
                return await self._restore(failure, source)
            await self._engine.update_weight_version(UNLABELLED if source.step is None else str(source.step))
            if not isinstance(source, AdapterWeights):
                self._base = source
                if self._adapter is not None:
                    await self._adapter.clear()  # new full weights: the policy is them alone
            self._current = str(source.path)
            self._loaded = None
            return None, 200
        finally:
            await self._engine.resume_generation()

    async def _restore(self, failure: str, source: WeightSource) -> tuple[str, int]:
        """After `source` failed to load: the previous policy serving again, or why it cannot."""
        if isinstance(source, AdapterWeights):  # vLLM loads an adapter before it evicts the one serving
            return f"{failure}; the previous policy from {self._current} keeps serving", 400
        if isinstance(self._base, MemoryWeights):  # the weights serving before came from memory: no copy to restore
            return (
                f"{failure}; the previous weights were received in memory and cannot be restored: restart the server",
                500,
            )
        restore_failure = await self._load(self._base)
        if restore_failure is None:
            return f"{failure}; the previous weights from {self._base.path} are restored and serving", 400
        return f"{failure}; restoring the previous weights failed too ({restore_failure}): restart the server", 500

    async def _load(
        self, source: WeightSource, receivers: tuple[int, int] = (0, 1), joined: Joined | None = None
    ) -> str | None:
        """Hot-load the adapter `source` is, receive the policy it names in memory through
        `joined` (this server being receiver `receivers[0]` of `receivers[1]`), or reload the full
        weights in place from it on every worker; the failure text, or None."""
        try:
            match source:
                case AdapterWeights():
                    assert self._adapter is not None  # _check_and_join refused adapters otherwise
                    await self._adapter.load(source.path)
                case MemoryWeights():
                    assert joined is not None  # _check_and_join joined every policy sent in memory
                    await receive_policy(self._engine, joined, *receivers, self._tp_pp)
                case FileWeights():
                    await reload_files(self._engine, source.path)
        except Exception as e:
            return f"loading weights from {source.path} failed in the engine: {type(e).__name__}: {e}"
        return None
