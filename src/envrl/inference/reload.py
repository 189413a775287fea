"""`POST /update_weights`: load the trainer's HF safetensors into the running vLLM engine.

Guarantee: a reload either completes (the response comes after the new weights serve every
later request) or is refused with an error naming the problem while the previous weights keep
serving. Reloads are serialised; requests in flight when one starts finish on the old weights
(generation is paused in vLLM's "wait" mode), requests arriving meanwhile wait and run on the new.

Shipped to vLLM as an endpoint plugin (entry point group `vllm.endpoint_plugins`, enabled by
`VLLM_PLUGINS=envrl`), so the server is vLLM's own OpenAI server with this one route added.
The engine side is vLLM's native `Worker.reload_weights` (which also redoes the post-load
processing, on CPU the GEMM weight prepacking, that a plain `load_weights` skips), wrapped by
our worker extension (envrl.inference.worker) to keep tied output embeddings in step.
"""

from __future__ import annotations

import asyncio
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from loguru import logger
from pydantic import BaseModel

from envrl.inference.weights import Shapes, WeightsError, check_replacement, read_shapes

PLUGIN_NAME = "envrl"


class UpdateWeightsRequest(BaseModel):
    path: str
    """Directory of HF safetensors with the served model's architecture."""


class WeightReloadPlugin:
    """vLLM endpoint plugin adding `POST /update_weights` (see the module docstring)."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self._engine: Any = None
        self._served: Shapes = {}
        self._current = ""
        self._lock = asyncio.Lock()

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter()
        router.add_api_route("/update_weights", self.update_weights, methods=["POST"])
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._engine = engine_client
        self._current = str(args.model)
        self._served = read_shapes(Path(args.model))

    async def update_weights(self, request: UpdateWeightsRequest) -> JSONResponse:
        path = Path(request.path).resolve()
        async with self._lock:
            start = time.perf_counter()
            try:
                await asyncio.to_thread(check_replacement, path, self._served)
            except WeightsError as e:
                logger.warning(f"weight reload refused: {e}")
                return JSONResponse({"error": str(e)}, status_code=400)
            await self._engine.pause_generation(mode="wait", clear_cache=True)
            try:
                failure = await self._load(path)
                if failure is None:
                    self._current = str(path)
                else:
                    restore_failure = await self._load(self._current)
                    status = 400 if restore_failure is None else 500
                    failure += (
                        f"; the previous weights from {self._current} are restored and serving"
                        if restore_failure is None
                        else f"; restoring the previous weights failed too ({restore_failure}): restart the server"
                    )
            finally:
                await self._engine.resume_generation()
        if failure is not None:
            logger.error(failure)
            return JSONResponse({"error": failure}, status_code=status)
        seconds = time.perf_counter() - start
        logger.info(f"weights reloaded from {path} in {seconds:.2f}s")
        return JSONResponse({"status": "ok", "path": str(path), "seconds": seconds})

    async def _load(self, path: Path | str) -> str | None:
        """Reload in place from `path` on every worker; the failure text, or None."""
        try:
            await self._engine.collective_rpc("envrl_reload_weights", args=(str(path),))
        except Exception as e:
            return f"loading weights from {path} failed in the engine: {type(e).__name__}: {e}"
        return None
