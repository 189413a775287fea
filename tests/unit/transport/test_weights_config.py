"""`rl` refuses the memory transport with self-recovery at start, in one line (issue 37): a
replica restarting during a reload breaks the transfer's group, and the trainer died at its
next publish."""

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.run import plan

ENVS = ("orchestrator.envs", '[{"id": "reverse-text"}]')


def test_the_memory_transport_with_restarts_is_refused_in_one_line() -> None:
    rl = resolve_config(RLConfig, overrides=[ENVS, ("trainer.weights.transport", "memory")])
    with pytest.raises(ConfigError, match=r"set restarts.max_restarts = 0, or use the filesystem transport") as refused:
        plan(rl)
    assert "\n" not in str(refused.value)


def test_the_memory_transport_without_restarts_runs() -> None:
    rl = resolve_config(
        RLConfig, overrides=[ENVS, ("trainer.weights.transport", "memory"), ("restarts.max-restarts", "0")]
    )
    assert plan(rl).trainer.weights.transport == "memory"
