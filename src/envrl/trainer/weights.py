"""The trainer's publishers: every rank gathers the policy and rank 0 hands it to the configured transport (files, a
LoRA adapter, or memory); stale transfers are removed first; `weights/final/` is a plain HF model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from loguru import logger
from torch import nn
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from envrl.data.layout import weights_dir
from envrl.runtime.atomic import atomic_dir
from envrl.trainer.model.lora import export_merged, is_lora, publish_adapter
from envrl.trainer.parallel import Runtime, barrier, full_state_dict
from envrl.transport.config import WeightsConfig
from envrl.transport.files import export_dtype, write_policy
from envrl.transport.memory import Backend, PolicySender, publish_transfer, remove_stale_transfers

if TYPE_CHECKING:
    from envrl.transport.weights import WeightPublisher


class FileWeightPublisher:
    """The filesystem transport of `envrl.transport.weights.WeightPublisher`: every policy as
    files in `weights/step_<k>/` of `output_dir` (see `publish_weights`)."""

    def __init__(
        self, output_dir: Path, tokenizer: PreTrainedTokenizerBase, runtime: Runtime, base_config: PretrainedConfig
    ) -> None:
        self.output_dir = output_dir
        self.tokenizer = tokenizer
        self.runtime = runtime
        self.base_config = base_config

    def publish(self, model: nn.Module, step: int, *, last: bool) -> bool:
        target = weights_dir(self.output_dir, step)
        return publish_weights(model, self.tokenizer, target, self.runtime, self.base_config)

    def close(self) -> None:
        pass


class MemoryWeightPublisher:
    """The memory transport of `WeightPublisher`: rank 0 snapshots policy k (the export dtype,
    the base checkpoint's names) and serves it to the replicas when the orchestrator has them
    load it (`PolicySender`), while training goes on. Snapshots older than the newest one served
    are released (no replica will ask for them: the orchestrator loads the newest). A LoRA
    adapter, the last policy and every `files_every`-th policy go to `files` instead: the first
    is small, the others must outlive the trainer (the final model, and where a restarted
    replica starts)."""

    def __init__(self, config: WeightsConfig, files: FileWeightPublisher, files_every: int) -> None:
        self.config = config
        self.files = files
        self.files_every = files_every
        runtime = files.runtime
        self.backend: Backend = "nccl" if runtime.device.type == "cuda" else "gloo"
        if config.backend != "auto":
            self.backend = config.backend
        self.senders: list[PolicySender] = []

    def publish(self, model: nn.Module, step: int, *, last: bool) -> bool:
        self._release_served()
        on_files = self.files_every > 0 and step % self.files_every == 0
        if last or on_files or is_lora(model):
            return self.files.publish(model, step, last=last)
        runtime, target = self.files.runtime, weights_dir(self.files.output_dir, step)
        if target.exists():
            logger.warning(f"{target} already exists (published before a resume); keeping it")
            return False
        state = full_state_dict(model, runtime)
        if runtime.is_main:
            sender = PolicySender(
                step,
                policy_tensors(model, state, export_dtype(self.files.base_config)),
                backend=self.backend,
                host=self.config.host,
                timeout_s=self.config.timeout_s,
                bucket_bytes=self.config.bucket_mb * 2**20,
                publish=lambda content, secret: publish_transfer(target, content, secret),
            )
            self.senders.append(sender)
        barrier(runtime)
        return True

    def _release_served(self) -> None:
        """Raise the error of a broken broadcast; close the senders of every policy up to the
        newest one served."""
        if broken := next((s.error for s in self.senders if s.error is not None), None):
            raise broken
        served = [i for i, s in enumerate(self.senders) if s.served.is_set()]
        if served:
            for sender in self.senders[: served[-1] + 1]:
                sender.close()
            del self.senders[: served[-1] + 1]

    def close(self) -> None:
        """Finish the broadcasts under way, release every snapshot."""
        for sender in self.senders:
            sender.close()
        self.senders.clear()


def policy_tensors(
    model: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype
) -> list[tuple[str, torch.Tensor]]:
    """A copy of the tensors a published policy holds, named as in the base checkpoint and in
    its dtype: a tied parameter (lm_head tied to embed_tokens) once, under its first name, as
    HF saves it."""
    first: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            tied.add(name)
    return [(name, tensor.to(dtype, copy=True)) for name, tensor in state.items() if name not in tied]


def weight_publisher(
    config: WeightsConfig,
    output_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    runtime: Runtime,
    base_config: PretrainedConfig,
    files_every: int,
) -> WeightPublisher:
    """The publisher `trainer.weights.transport` names (files written every `files_every` steps
    by the memory transport too: the checkpoint interval)."""
    if runtime.is_main:
        remove_stale_transfers(output_dir)
    barrier(runtime)
    files = FileWeightPublisher(output_dir, tokenizer, runtime, base_config)
    if config.transport == "filesystem":
        return files
    return MemoryWeightPublisher(config, files, files_every)


def publish_weights(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    final: Path,
    runtime: Runtime,
    base_config: PretrainedConfig,
) -> bool:
    """Write the model to `final` (all ranks call this); False if `final` already existed.

    An existing directory is kept, not replaced: after a resume it is the policy the inference
    server may already be serving, and the orchestrator decides when weight dirs go away.
    """
    if final.exists():
        logger.warning(f"{final} already exists (written before a resume); keeping it")
        return False
    state = full_state_dict(model, runtime)
    if runtime.is_main and is_lora(model):
        publish_adapter(model, state, final)
    elif runtime.is_main:
        write_policy(model, state, final, base_config, tokenizer)
    barrier(runtime)
    return True


def publish_final(model_name: str, published: Path, final: Path, runtime: Runtime, lora: bool) -> None:
    """Make the policy published at `published` loadable for good at `final` (main rank only).

    A full model's files are hard-linked (no copy; they outlive `published`); an adapter is
    merged into the base model `model_name` and saved as a plain HF model. A `final` left by an
    earlier end of this run (before a resume that went further) is replaced.
    """
    if runtime.is_main:
        if final.exists():
            logger.warning(f"replacing {final} from an earlier end of this run")
            shutil.rmtree(final)
        if lora:
            export_merged(model_name, published, final)
        else:
            with atomic_dir(final) as tmp:
                for file in published.iterdir():
                    os.link(file, tmp / file.name)
        logger.info(f"final policy at {final}")
    barrier(runtime)
