"""Serving a LoRA policy: after `PolicyAdapter.load(path)` every later request for the served name runs with that
adapter (always the same id, reloaded in place); a failed load leaves the previous one serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envrl.config import ConfigError
from envrl.transport.files import WeightsError
from envrl.transport.source import AdapterWeights

ADAPTER_NAME = "envrl-policy"
ADAPTER_ID = 1


def check_adapter(adapter: AdapterWeights, max_rank: int) -> None:
    """WeightsError unless the server takes an adapter of `adapter`'s rank."""
    if adapter.rank > max_rank:
        raise WeightsError(
            f"the adapter in {adapter.path} has rank {adapter.rank}, above this server's max_lora_rank {max_rank}; "
            f"start it with inference.vllm.max_lora_rank >= {adapter.rank} (`rl` sets it from trainer.lora.rank)"
        )


def check_lora_support(architectures: list[str], model: str) -> None:
    """ConfigError when vLLM has a class of its own for the model and that class cannot take LoRA
    (an architecture vLLM only serves through transformers is left to vLLM to judge)."""
    from vllm.model_executor.models import ModelRegistry, supports_lora

    for arch in architectures:
        registered = ModelRegistry.models.get(arch)
        if registered is not None and not supports_lora(registered.load_model_cls()):
            raise ConfigError(
                f"trainer.lora / inference.vllm.enable_lora: vLLM cannot serve LoRA adapters for {model} "
                f"(architecture {arch}); train it without trainer.lora (full fine-tuning)"
            )


class PolicyAdapter:
    """The adapter the policy is served with; `engine` is vLLM's engine client, `models` its
    `OpenAIServingModels` (the name -> adapter table its request handlers read)."""

    def __init__(self, engine: Any, models: Any, served_names: list[str]) -> None:
        self.engine = engine
        self.models = models
        self.served_names = served_names
        self.path: str | None = None
        """The adapter serving now (None: the bare base model)."""

    async def load(self, path: Path) -> None:
        """Load `path` in place of the current adapter; raises (the previous one keeps serving)."""
        from vllm.lora.request import LoRARequest

        def request(inplace: bool) -> LoRARequest:
            return LoRARequest(
                lora_name=ADAPTER_NAME, lora_int_id=ADAPTER_ID, lora_path=str(path), load_inplace=inplace
            )

        await self.engine.add_lora(request(inplace=True))
        routed = request(inplace=False)  # requests carry it: in place would reload the files every step
        for name in self.served_names:
            self.models.lora_requests[name] = routed
        self.path = str(path)

    async def clear(self) -> None:
        """Serve the bare base model again."""
        if self.path is None:
            return
        for name in self.served_names:
            self.models.lora_requests.pop(name, None)
        await self.engine.remove_lora(ADAPTER_ID)
        self.path = None
