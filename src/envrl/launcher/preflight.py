"""`check(rl)`, before anything starts: a model, env id, env args, LoRA target or teacher that is not there is one
`ConfigError` naming the key (and the closest valid choices)."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path

from envrl.config import ConfigError
from envrl.envs.registry import environment_loader, installed_environment_ids
from envrl.launcher.config import RLConfig
from envrl.runtime.cli import check_model


def check(rl: RLConfig) -> None:
    check_model(rl.model.name)
    distill = rl.orchestrator.distill
    if distill is not None and distill.teacher_weights is not None:
        _check_teacher_weights(distill.teacher_weights)
    if rl.trainer.lora is not None and Path(rl.model.name).expanduser().is_dir():
        from envrl.trainer.model.lora import LoraError, check_lora_model  # torch: only for LoRA runs

        try:
            check_lora_model(rl.trainer.lora, rl.model.name)
        except LoraError as e:
            raise ConfigError(str(e)) from None
    installed = installed_environment_ids()
    for i, env in enumerate(rl.orchestrator.envs):  # every env server of the run is declared there
        served_here = env.address is None and env.python is None and env.project is None
        if not served_here or ":" in env.id:
            continue
        if env.id not in installed:
            close = difflib.get_close_matches(env.id, installed, n=2)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise ConfigError(
                f"orchestrator.envs[{i}].id {env.id!r}: no installed environment has this id; {hint}"
                f"installed: {', '.join(installed) or 'none'} (`uv run --no-sync rl envs` lists them)"
            )
        _check_args(f"orchestrator.envs[{i}].args", env.id, env.args)


def _check_teacher_weights(weights: str) -> None:
    """The model directory `rl` would serve as the distillation teacher exists and is an HF model."""
    path = Path(weights).expanduser()
    if not (path / "config.json").is_file():
        what = "has no config.json" if path.is_dir() else f"does not exist (working directory {Path.cwd()})"
        raise ConfigError(
            f"orchestrator.distill.teacher_weights {weights!r}: {path} {what}, so rl cannot serve it as the teacher; "
            "train the teacher first (its run's weights/final) or point teacher_weights at an HF model directory"
        )


def _check_args(key: str, env_id: str, args: dict[str, object]) -> None:
    """The env's `load_environment` accepts every key of `args` (a loader taking **kwargs accepts any)."""
    parameters = inspect.signature(environment_loader(env_id)).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"{key}: {env_id!r} takes no argument {unknown[0]!r}; {hint}it accepts: {', '.join(accepted) or 'none'}"
        )
