"""Engine side of `/update_weights` (a vLLM worker extension): after `envrl_reload_weights(path)` every parameter, a
tied output head included, comes from `path`; importing it registers the `gloo` transfer engine."""

from __future__ import annotations

from typing import Any

import torch

import envrl.inference.transfer  # noqa: F401  (registers the gloo engine in this worker)


class WeightReloadExtension:
    """Mixed into vLLM's Worker class by vLLM itself; `self` is the worker."""

    def envrl_reload_weights(self, path: str) -> None:
        worker: Any = self  # vLLM's Worker provides reload_weights and model_runner
        worker.reload_weights(weights_path=path, is_checkpoint_format=True)
        retie_output_embeddings(worker.model_runner.get_model())

    def envrl_retie_output_embeddings(self) -> None:
        """After a weight transfer (vLLM's `finish_weight_update`): see `retie_output_embeddings`."""
        worker: Any = self
        retie_output_embeddings(worker.model_runner.get_model())


def retie_output_embeddings(model: torch.nn.Module) -> None:
    """Point a tied `lm_head` at the current input embeddings and redo its post-load processing."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or not getattr(config, "tie_word_embeddings", False):
        return
    lm_head.tie_weights(model.get_submodule("model.embed_tokens"))
    lm_head.quant_method.process_weights_after_loading(lm_head)
