"""The foreign envs learn under `rl` (heavy: run under /tmp/envrl-heavy.lock): one 24-step run of
configs/debug/verifiers.toml with three train envs side by side, each with ratio 1, in which each
env's reward rises:
- the verifiers example (its env table as the config has it), its env server in the example's own
  venv (verifiers 0.4), its null harness forked from a warm interpreter per rollout;
- trl-count, TRL's calling convention through the TRL adapter;
- openenv-count, from its own light venv (deps/envs/openenv-count), the OpenEnv server
  (openenv-core) as that env server's child.

All three reward the share of digits in a count's continuation, so the one policy learns them
together; one run (one vLLM start) instead of one per example.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from statistics import fmean

import pytest

from tests.support.run_files import metric_lines
from tests.support.smoke import ROOT, FinishedRun, run_to_end
from tests.support.verifiers_env import example_python

CONFIG = ROOT / "configs" / "debug" / "verifiers.toml"
OPENENV_PROJECT = ROOT / "deps" / "envs" / "openenv-count"
OPENENV_PYTHON = OPENENV_PROJECT / ".venv" / "bin" / "python"
STEPS = 24

pytestmark = pytest.mark.skipif(
    not OPENENV_PYTHON.exists(), reason=f"the example's venv is missing: uv sync --project {OPENENV_PROJECT} --locked"
)


def rewards_of(out: Path, env: str) -> list[float]:
    return [m[f"train/{env}/reward"] for m in metric_lines(out) if f"train/{env}/reward" in m]


@pytest.fixture(scope="module")
def adapters_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """The config's 24 steps of 16 rollouts without an eval env, its train envs the verifiers
    example, trl-count and openenv-count (4 groups a step, each drawn among the three)."""
    example_python()  # `uv sync --project deps/envs/verifiers-digits --locked`, as the README says
    [verifiers] = tomllib.loads(CONFIG.read_text())["orchestrator"]["envs"]
    one_worker = {"min_workers": 1, "max_workers": 1}
    envs = [
        {**verifiers, "project": str(ROOT / verifiers["project"]), "ratio": 1},
        {"id": "trl-count", "ratio": 1, "pool": one_worker},
        {"id": "openenv-count", "project": str(OPENENV_PROJECT), "ratio": 1, "pool": one_worker},
    ]
    out = tmp_path_factory.mktemp("adapters") / "run"
    overrides = ["--config", str(CONFIG), "--orchestrator.envs", json.dumps(envs), "--orchestrator.eval.env", "[]"]
    return run_to_end(out, *overrides)


def test_the_run_finishes_and_leaves_nothing_running(adapters_run: FinishedRun) -> None:
    adapters_run.check("processes of the run survived it (a warm harness server?)")
    trained = [m["step"] for m in metric_lines(adapters_run.out) if "trainer/loss" in m]
    assert sorted(trained) == list(range(STEPS))


@pytest.mark.parametrize("env", ["verifiers:digits-count", "trl-count", "openenv-count"])
def test_rl_trains_on_each_foreign_env(adapters_run: FinishedRun, env: str) -> None:
    """Each env's reward rises. Alone, each was measured, first-5 vs last-5 step means:
    verifiers 0.099 -> 0.375, 0.090 -> 0.283, 0.093 -> 0.290, 0.089 -> 0.357, 0.107 -> 0.385 (its
    own 24-step run, five runs); trl 0.10 -> 0.29 and openenv 0.10 -> 0.28 (a run of both), with
    step-to-step noise ~0.03 around the trend; so a gain of 0.1 leaves a margin."""
    assert adapters_run.code == 0, adapters_run.console[-3000:]
    rewards = rewards_of(adapters_run.out, env)
    # each step's 4 groups are drawn among 3 envs: an env is in about 80% of the steps
    assert len(rewards) >= 12 and fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.1, (env, rewards)
