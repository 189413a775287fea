"""The foreign envs learn under `rl` (heavy: run under /tmp/envrl-heavy.lock): one 48-step run of
configs/debug/verifiers.toml with three train envs side by side, in which each env's reward rises:
- the verifiers example (its env table as the config has it), its env server in the example's own
  venv (verifiers 0.4), its null harness forked from a warm interpreter per rollout;
- trl-count, TRL's calling convention through the TRL adapter, with ratio 2 (half the groups;
  its prompts carry its tools, and at a third of the groups for 24 steps its reward did not rise);
- openenv-count, from its own light venv (deps/envs/openenv-count), the OpenEnv server
  (openenv-core) as that env server's child.

All three reward the share of digits in a count's continuation, so the one policy learns them
together; one run (one vLLM start) instead of one per example. Steps are short (~0.5 s of the
tiny model's 16 rollouts); the run's start is most of its time.
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
STEPS = 48

pytestmark = pytest.mark.skipif(
    not OPENENV_PYTHON.exists(), reason=f"the example's venv is missing: uv sync --project {OPENENV_PROJECT} --locked"
)


def rewards_of(out: Path, env: str) -> list[float]:
    return [m[f"train/{env}/reward"] for m in metric_lines(out) if f"train/{env}/reward" in m]


@pytest.fixture(scope="module")
def adapters_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """The config's steps of 16 rollouts (48 of them) without an eval env, its train envs the
    verifiers example, trl-count and openenv-count (4 groups a step, each drawn by ratio)."""
    example_python()  # `uv sync --project deps/envs/verifiers-digits --locked`, as the README says
    [verifiers] = tomllib.loads(CONFIG.read_text())["orchestrator"]["envs"]
    one_worker = {"min_workers": 1, "max_workers": 1}
    envs = [
        {**verifiers, "project": str(ROOT / verifiers["project"]), "ratio": 1},
        {"id": "trl-count", "ratio": 2, "pool": one_worker},
        {"id": "openenv-count", "project": str(OPENENV_PROJECT), "ratio": 1, "pool": one_worker},
    ]
    out = tmp_path_factory.mktemp("adapters") / "run"
    overrides = ["--config", str(CONFIG), "--max-steps", str(STEPS), "--orchestrator.envs", json.dumps(envs)]
    overrides += ["--orchestrator.eval.env", "[]"]
    return run_to_end(out, *overrides)


def test_the_run_finishes_and_leaves_nothing_running(adapters_run: FinishedRun) -> None:
    adapters_run.check("processes of the run survived it (a warm harness server?)")
    trained = [m["step"] for m in metric_lines(adapters_run.out) if "trainer/loss" in m]
    assert sorted(trained) == list(range(STEPS))


@pytest.mark.parametrize("env", ["verifiers:digits-count", "trl-count", "openenv-count"])
def test_rl_trains_on_each_foreign_env(adapters_run: FinishedRun, env: str) -> None:
    """Each env's reward rises. Measured, first-5 vs last-5 step means, in 24-step runs:
    verifiers alone 0.099 -> 0.375, 0.090 -> 0.283, 0.093 -> 0.290, 0.089 -> 0.357, 0.107 -> 0.385
    (five runs); trl 0.10 -> 0.29 and openenv 0.10 -> 0.28 in a run of both (half the groups each),
    with step-to-step noise ~0.03 around the trend. With the three at ratio 1 for 24 steps,
    verifiers (0.11 -> 0.26) and openenv (0.09 -> 0.23) rose but trl did not (0.12 -> 0.10): it
    gets half of the groups here, and twice the steps."""
    assert adapters_run.code == 0, adapters_run.console[-3000:]
    rewards = rewards_of(adapters_run.out, env)
    # each step's 4 groups are drawn by ratio: verifiers and openenv are in about 2/3 of the steps
    assert len(rewards) >= 24 and fmean(rewards[-5:]) >= fmean(rewards[:5]) + 0.1, (env, rewards)
