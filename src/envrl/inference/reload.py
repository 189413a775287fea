"""`POST /update_weights`: load the trainer's HF safetensors, or its LoRA adapter, into the
running vLLM engine.

Guarantee: a reload either completes (the response comes after the new weights serve every
later request) or is refused with an error naming the problem while the previous weights keep
serving; whatever happens, generation is resumed before the response. Reloads are serialised
and idempotent per policy step: a repeated POST of a step already loaded (a client retrying
after a lost answer) changes nothing and gets the first answer again. Each reload has a
server-side deadline (`inference.reload.timeout_s`). Requests arriving during a reload wait and
run on the new weights; what happens to those in flight when it starts is the caller's choice
(`in_flight`, see `IN_FLIGHT_PAUSE`): by default they finish on the old weights first (vLLM's
"wait" pause); for partial rollouts they are frozen and go on under the new weights after the
load. Every token a request generates is labelled with the policy step that sampled it (vLLM's
weight version, returned as `weight_versions` spans): the step of the last reload that gave one;
the weights the server started with, or loaded without a step, have a label that is no number. Off loopback,
callers must send the token (`inference.reload`).

Shipped to vLLM as an endpoint plugin (entry point group `vllm.endpoint_plugins`, enabled by
`VLLM_PLUGINS=envrl`), so the server is vLLM's own OpenAI server with this one route added.
The engine side is vLLM's native `Worker.reload_weights` (which also redoes the post-load
processing, on CPU the GEMM weight prepacking, that a plain `load_weights` skips), wrapped by
our worker extension (envrl.inference.worker) to keep tied output embeddings in step.
A directory holding a PEFT adapter (a `trainer.lora` run) is hot-loaded onto the base model
instead (envrl.inference.adapter), which needs a server started with `enable_lora`; a full
reload afterwards serves that model without an adapter. A directory holding `transfer.json`
names a policy the trainer sends in memory (envrl.transport.memory): with the policy's secret
from the request body (never from disk), the server joins the trainer's rendezvous, refusing a
sender that cannot prove that secret before the engine is touched, says there how many receive
(from the request), and joins that broadcast through vLLM's own weight-transfer calls
(`init_weight_transfer_engine`, `start/update/finish_weight_update`) on the engine it was
started with, under this route's
token, pause and deadline; a broken transfer cannot restore the previous weights (they were
never on disk), so it is answered 500: restart the server.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Header
from fastapi.responses import JSONResponse
from loguru import logger
from pydantic import BaseModel, Field

from envrl.inference.adapter import PolicyAdapter, check_adapter, is_adapter_dir
from envrl.inference.config import ReloadConfig
from envrl.inference.warmup import WARMUP_ENV, warm_up
from envrl.inference.weights import Shapes, WeightsError, check_replacement, check_shapes, read_shapes
from envrl.transport.memory import WORLD_SIZE_KEY, TransferInfo, TransferSecret, is_transfer_dir, read_transfer
from envrl.transport.rendezvous import RendezvousError, RendezvousStore

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


Joined = tuple[TransferInfo, TransferSecret, RendezvousStore]
"""A policy sent in memory whose sender proved its secret: what it is, the secret, the rendezvous."""


class WeightReloadPlugin:
    """vLLM endpoint plugin adding `POST /update_weights` (see the module docstring)."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self._engine: Any = None
        self._served: Shapes = {}
        self._current = ""
        """The served policy: the adapter directory, or the full weights' directory."""
        self._base = ""
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

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._engine = engine_client
        model = Path(args.model)
        self._current = self._base = str(model.resolve()) if model.is_dir() else str(args.model)
        self._served = read_shapes(Path(args.model))
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

    async def update_weights(
        self, request: UpdateWeightsRequest, authorization: str | None = Header(None)
    ) -> JSONResponse:
        token = self._config.token()
        if token is not None and not hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode()):
            logger.warning("weight reload refused: missing or wrong token")
            return JSONResponse(
                {
                    "error": f"/update_weights needs 'Authorization: Bearer <token>' (the token in {self._config.token_env})"
                },
                status_code=401,
            )
        path = Path(request.path).resolve()
        deadline = min(self._config.timeout_s, request.timeout_s or self._config.timeout_s)
        async with self._lock:
            if self._loaded is not None and request.step is not None and self._loaded[0] == request.step:
                step, loaded_path, answer = self._loaded
                if loaded_path != str(path):
                    return JSONResponse(
                        {"error": f"policy step {step} was loaded from {loaded_path}, not {path}"}, status_code=409
                    )
                logger.info(f"weight reload of step {step} asked again: already serving it")
                return JSONResponse(answer)
            start = time.perf_counter()
            try:
                await asyncio.to_thread(self._check, path)
                joined = await asyncio.to_thread(self._join, path, request.transfer, deadline)
            except (WeightsError, RendezvousError) as e:
                logger.warning(f"weight reload refused: {e}")
                return JSONResponse({"error": f"{e}; the previous weights keep serving"}, status_code=400)
            try:
                failure, status = await self._reload(
                    path, deadline, (request.replica, request.replicas), request.step, request.in_flight, joined
                )
            finally:
                if joined is not None:
                    joined[2].close()
        if failure is not None:
            logger.error(failure)
            return JSONResponse({"error": failure}, status_code=status)
        seconds = time.perf_counter() - start
        answer = {"status": "ok", "path": str(path), "step": request.step, "seconds": seconds}
        if request.step is not None:
            self._loaded = (request.step, str(path), answer)
        what = (
            "LoRA adapter hot-loaded"
            if is_adapter_dir(path)
            else "weights received in memory"
            if is_transfer_dir(path)
            else "weights reloaded"
        )
        logger.info(f"{what} from {path} in {seconds:.2f}s (requests in flight: {request.in_flight})")
        return JSONResponse(answer)

    def _check(self, path: Path) -> None:
        """WeightsError unless `path` can replace the served policy (read from headers and configs)."""
        if is_transfer_dir(path):
            self._check_transfer(path)
        elif not is_adapter_dir(path):
            check_replacement(path, self._served)
        elif self._adapter is None:
            raise WeightsError(
                f"{path} holds a LoRA adapter, but this server was started without LoRA; start it with "
                "inference.vllm.enable_lora = true (`rl` does so when trainer.lora is set)"
            )
        else:
            check_adapter(path, self._max_lora_rank)

    def _check_transfer(self, path: Path) -> None:
        try:
            info = read_transfer(path)
        except ValueError as e:
            raise WeightsError(str(e)) from None
        if info.backend != self._transfer_backend:
            raise WeightsError(
                f"{path} is sent in memory over {info.backend}, but this server's weight-transfer engine is "
                f'{self._transfer_backend}; set inference.vllm.weight_transfer_config = {{backend = "{info.backend}"}}'
            )
        check_shapes(dict(zip(info.names, map(tuple, info.shapes), strict=True)), self._served, str(path))

    @staticmethod
    def _join(path: Path, transfer: TransferSecret | None, timeout_s: float) -> Joined | None:
        """For a policy sent in memory: its sender's rendezvous, once the sender proved the secret
        (RendezvousError otherwise); None for weights on disk."""
        if not is_transfer_dir(path):
            return None
        if transfer is None:
            raise WeightsError(
                f"{path} names a policy sent in memory, but the request carries no `transfer` secret; send the "
                "policy's transfer.secret in the body (envrl's orchestrator does)"
            )
        info = read_transfer(path)
        if info.backend == "nccl" and transfer.nccl_unique_id_b64 is None:
            raise WeightsError(f"{path} is sent over nccl, but the request's `transfer` carries no nccl_unique_id_b64")
        return info, transfer, RendezvousStore(info.host, info.port, transfer.secret, timeout_s)

    async def _reload(
        self,
        path: Path,
        deadline: float,
        receivers: tuple[int, int],
        step: int | None,
        in_flight: InFlight,
        joined: Joined | None,
    ) -> tuple[str | None, int]:
        """Pause (as `in_flight` says), load `path` (restoring the old weights if that fails) and
        label what it generates from now on as `step`, always resume; (failure, status)."""
        started = time.monotonic()
        mode, clear_cache = IN_FLIGHT_PAUSE[in_flight]
        try:
            try:
                await asyncio.wait_for(self._engine.pause_generation(mode=mode, clear_cache=clear_cache), deadline)
            except TimeoutError:
                return (
                    f"requests in flight did not finish within {deadline:g} s (inference.reload.timeout_s); "
                    f"reload of {path} abandoned, the previous weights from {self._current} keep serving; retry later",
                    503,
                )
            left = max(deadline - (time.monotonic() - started), 1e-3)
            try:
                failure = await asyncio.wait_for(self._load(path, receivers, joined), left)
            except TimeoutError:
                return (
                    f"loading {path} did not finish within the {deadline:g} s deadline (inference.reload.timeout_s); "
                    "which weights serve is unknown: restart the server",
                    500,
                )
            if failure is None:
                await self._engine.update_weight_version(UNLABELLED if step is None else str(step))
                if not is_adapter_dir(path):
                    self._base = str(path)
                    if self._adapter is not None:
                        await self._adapter.clear()  # new full weights: the policy is them alone
                self._current = str(path)
                self._loaded = None
                return None, 200
            if is_adapter_dir(path):  # vLLM loads an adapter before it evicts the one serving
                return f"{failure}; the previous policy from {self._current} keeps serving", 400
            if is_transfer_dir(self._base):  # the weights serving before came from memory: no copy to restore
                return (
                    f"{failure}; the previous weights were received in memory and cannot be restored: restart the server",
                    500,
                )
            restore_failure = await self._load(self._base)
            if restore_failure is None:
                return f"{failure}; the previous weights from {self._base} are restored and serving", 400
            return f"{failure}; restoring the previous weights failed too ({restore_failure}): restart the server", 500
        finally:
            await self._engine.resume_generation()

    async def _receive(self, joined: Joined, receivers: tuple[int, int]) -> None:
        """Join the trainer's broadcast of policy `info.step` through vLLM's weight-transfer calls:
        say how many receive (in the proven rendezvous), init, start, update, finish, release."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

        info, secret, store = joined
        replica, replicas = receivers
        world_size = 1 + replicas * self._tp_pp
        await asyncio.to_thread(store.set, WORLD_SIZE_KEY, str(world_size))
        init_info = info.init_info(rank_offset=1 + replica * self._tp_pp, world_size=world_size, secret=secret)
        await self._engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
        try:
            await self._engine.start_weight_update()
            await self._engine.update_weights(WeightTransferUpdateRequest(update_info=info.update_info()))
            await self._engine.finish_weight_update(weight_version=str(info.step))
            await self._engine.collective_rpc("envrl_retie_output_embeddings")
        finally:
            await self._engine.shutdown_weight_transfer_engine()

    async def _load(
        self, path: Path | str, receivers: tuple[int, int] = (0, 1), joined: Joined | None = None
    ) -> str | None:
        """Hot-load the adapter in `path`, receive the policy it names in memory through `joined`
        (this server being receiver `receivers[0]` of `receivers[1]`), or reload the full weights
        in place from it on every worker; the failure text, or None."""
        path = Path(path)
        try:
            if is_adapter_dir(path):
                assert self._adapter is not None  # _check refused adapters otherwise
                await self._adapter.load(path)
                return None
            if joined is not None:
                await self._receive(joined, receivers)
                return None
            await self._engine.collective_rpc("envrl_reload_weights", args=(str(path),))
        except Exception as e:
            return f"loading weights from {path} failed in the engine: {type(e).__name__}: {e}"
        return None
