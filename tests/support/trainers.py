"""An in-process Trainer on the tiny model for the trainer's unit tests.

Guarantee: `make_trainer` builds the trainer the CLI would from the same keys (wandb off, a
30 s batch timeout), so a unit test drives the real training loop without spawning a process.
"""

from __future__ import annotations

import json

from safetensors import safe_open

from envrl.config import resolve_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.loop import Trainer
from envrl.trainer.parallel import init_runtime
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR


def make_trainer(tmp_path, **overrides) -> Trainer:
    base = {
        "model": {"name": str(DEFAULT_DIR)},
        "output_dir": str(tmp_path),
        "micro_batch_tokens": 128,
        "batch_timeout_s": 30,
        "optim": {"lr": 3e-3},
        "wandb": {"mode": "disabled"},
    }
    config = resolve_config(TrainerConfig, base=base, overrides=[(k, json.dumps(v)) for k, v in overrides.items()])
    return Trainer(config, init_runtime(config))


def tensor_names(directory) -> list[str]:
    with safe_open(directory / "model.safetensors", "pt") as f:
        return sorted(f.keys())
