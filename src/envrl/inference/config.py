"""Config of the `inference` entry point.

Guarantee: everything vLLM is started with comes from this model (engine options pass through
`vllm` untouched) plus the documented CPU defaults, and every file vLLM writes (compile cache,
RPC sockets, temp files) lands under `<output_dir>/inference/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envrl.config import BaseConfig, ModelConfig
from envrl.log import LogConfig


class InferenceConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    output_dir: Path = Path("outputs")
    """Run directory; vLLM's caches, RPC sockets and temp files go under `<output_dir>/inference/`."""
    host: str = "127.0.0.1"
    """Interface the OpenAI-compatible server binds."""
    port: int = 8000
    kv_cache_gib: int = 1
    """KV-cache size in GiB on CPU (VLLM_CPU_KVCACHE_SPACE); ignored on GPU (see vllm.gpu_memory_utilization)."""
    vllm: dict[str, Any] = {}
    """vLLM server/engine options, passed through as `--key value` (e.g. max_model_len = 2048,
    enforce_eager = true). On CPU, dtype = "float32" and enforce_eager = true are the defaults."""
    log: LogConfig = LogConfig()

    @property
    def work_dir(self) -> Path:
        return self.output_dir / "inference"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
