"""One evaluation of a training policy on one eval env (interval evals and the final one).

Guarantee: the env's whole grid runs (`eval_grid.py`: the `eval` command's seeds and limits)
within `max_inflight` rollouts; its rollouts are appended to `rollouts/eval/step_<step>.jsonl`
and its summary logged for `step` under `eval/<env>/`, with the policy step that generated it.
"""

from __future__ import annotations

import time
from pathlib import Path

from loguru import logger

from envrl.data.layout import eval_rollouts_file
from envrl.envclient.eval_grid import EvalGrid, run_grids
from envrl.envclient.handles import EnvHandle
from envrl.orchestrator.config import EvalEnvConfig
from envrl.orchestrator.rollout_files import append_rollouts
from envrl.telemetry.metrics import MetricsSink


async def evaluate(
    env: EnvHandle[EvalEnvConfig],
    step: int,
    policy_step: int,
    *,
    seed: int,
    max_inflight: int,
    output_dir: Path,
    sink: MetricsSink,
) -> None:
    """Evaluate the served policy (`policy_step`) on `env`'s grid, logged as step `step`'s."""
    started = time.monotonic()
    grid = EvalGrid(env, seed=seed)
    await run_grids([grid], max_inflight)
    path = eval_rollouts_file(output_dir, step)
    for group in grid.groups():
        append_rollouts(path, step, env.name, policy_step, group)
    metrics = {f"eval/{env.name}/{key}": value for key, value in grid.summary().items()}
    metrics[f"eval/{env.name}/policy_step"] = policy_step
    sink.log(step, metrics)
    sink.log_samples(step, f"eval/{env.name}/samples", [t for group in grid.groups() for t in group])
    logger.info(
        f"eval {env.name!r} at step {step} (policy {policy_step}): reward {metrics[f'eval/{env.name}/reward']:.3f}, "
        f"{grid.n * grid.r} rollouts in {time.monotonic() - started:.1f} s -> {path}"
    )
