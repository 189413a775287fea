"""Config of the `inference` entry point: vLLM starts with this model's options (`vllm` passed through) plus the CPU
defaults, and every file vLLM writes lands under `<output_dir>/inference/`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from envrl.config import BaseConfig, RunDirKeys
from envrl.data.layout import inference_work_dir
from envrl.runtime.net import is_loopback_host
from envrl.runtime.secrets import RELOAD_TOKEN_ENV
from envrl.telemetry.log import LogConfig

SERVABLE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 takes for `max_lora_rank`."""


def lora_serving_options(rank: int) -> dict[str, Any]:
    """vLLM options that serve adapters of rank `rank`: LoRA on, the smallest servable max rank."""
    return {"enable_lora": True, "max_lora_rank": next(r for r in SERVABLE_RANKS if r >= rank)}


class ReloadConfig(BaseConfig):
    """`POST /update_weights`: its deadline and who may call it."""

    timeout_s: float = Field(1800.0, gt=0)
    """Server-side deadline of one reload: waiting for in-flight requests to finish, then loading.
    Past it the reload is abandoned (the old weights keep serving if loading had not started)
    and generation resumes; the caller gets an error saying which phase ran out."""
    allow_remote: bool = False
    """Required to bind `host` to a non-loopback address: anyone who reaches the server could
    replace its weights, so `/update_weights` then demands the token in `token_env`."""
    token_env: str = RELOAD_TOKEN_ENV
    """Environment variable holding the token callers must send (`Authorization: Bearer ...`);
    required when `host` is not loopback, checked also on loopback when it is set."""

    def token(self) -> str | None:
        return os.environ.get(self.token_env) or None


class InferenceConfig(RunDirKeys):
    host: str = "127.0.0.1"
    """Interface the OpenAI-compatible server binds."""
    port: int = 8000
    """Port of the OpenAI-compatible server (replica i of several: port + i)."""
    kv_cache_gib: int = 1
    """KV-cache size in GiB on CPU (VLLM_CPU_KVCACHE_SPACE); ignored on GPU (see vllm.gpu_memory_utilization)."""
    vllm: dict[str, Any] = {}
    """vLLM server/engine options, passed through as `--key value` (e.g. max_model_len = 2048,
    enforce_eager = true). On CPU, dtype = "float32" and enforce_eager = true are the defaults."""
    warmup_requests: ClassVar[int] = 16
    """Concurrent warm-up generations (16 prompt + 8 sampled tokens each) the server runs before
    `/health` answers, so the first real requests are served at full speed."""
    reload: ReloadConfig = ReloadConfig()
    ready_timeout_s: float = Field(600.0, gt=0)
    """Seconds `rl` waits for every replica to serve, counted from their launch: the run's one
    inference start-up limit (the orchestrator, started later, waits as long). Read by `rl` only."""
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _reload_is_guarded(self) -> InferenceConfig:
        if not is_loopback_host(self.host):
            if not self.reload.allow_remote:
                raise ValueError(
                    f"inference.host = {self.host!r} is not loopback, so anyone reaching it could replace the weights "
                    "through /update_weights; set inference.reload.allow_remote = true and a token in the environment "
                    f"variable {self.reload.token_env} (inference.reload.token_env), or bind 127.0.0.1"
                )
            if self.reload.token() is None:
                raise ValueError(
                    f"inference.host = {self.host!r} is not loopback: /update_weights needs a token; set the environment "
                    f"variable {self.reload.token_env} (inference.reload.token_env) for the server and the orchestrator"
                )
        return self

    @property
    def work_dir(self) -> Path:
        return inference_work_dir(self.output_dir)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
