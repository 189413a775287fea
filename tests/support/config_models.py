"""The config models users write: each entry point's, and every model reachable from one."""

import typing

from pydantic import BaseModel

from envrl.config_schema import unwrap_types
from envrl.eval.config import EvalCommandConfig
from envrl.launcher.config import RLConfig
from envrl.serve.config import EnvServerConfig
from envrl.trainer.sft.main import SFTConfig

ENTRY_POINTS: list[type[BaseModel]] = [RLConfig, EvalCommandConfig, EnvServerConfig, SFTConfig]


def models_in(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """`model` and every model reachable through its fields (list items and union members too)."""
    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():
        for tp in unwrap_types(field.annotation):
            inner = unwrap_types(typing.get_args(tp)[0]) if typing.get_origin(tp) is list else [tp]
            for sub in inner:
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    models_in(sub, seen)
    return seen
