"""LoRA: adapters only on the named linear modules (an unknown name is a `LoraError` listing the model's), base
frozen, B = 0 so step 0 is the base model; adapters publish complete, and `export_merged` gives a plain HF model."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from envrl.runtime.atomic import atomic_dir
from envrl.trainer.config import LoraConfig
from envrl.transport.source import ADAPTER_CONFIG

if TYPE_CHECKING:
    from peft import PeftModel


class LoraError(ValueError):
    """`trainer.lora` does not fit the model; the message names the key and what the model has."""


def adaptable_modules(model: nn.Module) -> list[str]:
    """What `target_modules` may name: the last names of the decoder layers' linear modules, and
    `lm_head` (the output projection, which vLLM adapts too, tied to the embeddings or not)."""
    layers = model.get_decoder().layers
    names = {name.rsplit(".", 1)[-1] for name, module in layers.named_modules() if isinstance(module, nn.Linear)}
    if isinstance(getattr(model, "lm_head", None), nn.Linear):
        names.add("lm_head")
    return sorted(names)


def check_target_modules(lora: LoraConfig, available: list[str], model_name: str) -> None:
    """LoraError unless every `target_modules` entry names one of `available`."""
    unknown = [name for name in lora.target_modules if name not in available]
    if unknown:
        raise LoraError(
            f"trainer.lora.target_modules: {', '.join(map(repr, unknown))} not among the linear modules of "
            f"{model_name}'s decoder layers (or lm_head); it has: {', '.join(available)}"
        )


def check_lora_model(lora: LoraConfig, model_name: str) -> None:
    """Check `lora` against the model's module names without loading its weights (meta device)."""
    config = AutoConfig.from_pretrained(model_name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_target_modules(lora, adaptable_modules(model), model_name)


def apply_lora(model: nn.Module, lora: LoraConfig, model_name: str) -> PeftModel:
    """`model` with adapters on `lora.target_modules` (checked first); only adapter weights train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    check_target_modules(lora, adaptable_modules(model), model_name)
    peft_config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # An adapted lm_head tied to the embeddings: the adapter acts on the output side only, as
        # vLLM's does, and `export_merged` unties the head before merging, which is what peft warns of.
        warnings.filterwarnings("ignore", message=".*ensure_weight_tying.*")
        return get_peft_model(model, peft_config)


def is_lora(model: nn.Module) -> bool:
    """True for a model `apply_lora` returned."""
    return hasattr(model, "peft_config")


def publish_adapter(model: nn.Module, state: dict[str, torch.Tensor], final: Path) -> None:
    """Write the adapter weights of `state` (the model's full state dict) to `final`, atomically.

    Called on the main rank only; `state` comes from the collective that gathers shards.
    """
    with atomic_dir(final) as tmp:
        # save_embedding_layers: peft would add the whole (frozen) output head when lm_head is adapted
        model.save_pretrained(tmp, state_dict=state, save_embedding_layers=False)
        (tmp / "README.md").unlink(missing_ok=True)  # peft's model-card stub: nothing to read there


def export_merged(model_name: str, adapter: Path, final: Path) -> None:
    """Write `model_name` with the adapter in `adapter` merged into its weights to `final`: a plain HF
    model directory (its tokenizer included) that needs neither peft nor LoRA support to load.
    An adapted output head tied to the input embeddings is untied first (saved on its own)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model_name, dtype="auto")
    targets = json.loads((adapter / ADAPTER_CONFIG).read_text())["target_modules"]
    if "lm_head" in targets and getattr(base.config, "tie_word_embeddings", False):
        # merging into a head tied to the input embeddings would change the embeddings too
        base.lm_head.weight = nn.Parameter(base.lm_head.weight.detach().clone())
        base.config.tie_word_embeddings = False
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    with atomic_dir(final) as tmp:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(model_name).save_pretrained(tmp)
