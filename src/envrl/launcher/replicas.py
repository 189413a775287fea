"""`wait_for_replicas` returns only once every inference replica of an `rl` run answers /health, and fails at the
run's one start-up limit (`READY_TIMEOUT_KEY`) naming that key."""

from __future__ import annotations

import time
from collections.abc import Mapping

from envrl.inference.config import InferenceConfig
from envrl.inference.launch import wait_until_serving
from envrl.runtime.process import Child, ChildFailed
from envrl.runtime.supervisor import Supervisor

READY_TIMEOUT_KEY = "inference.ready_timeout_s"
"""The one start-up limit of an `rl` run's inference: the launcher counts it from the replicas'
launch, the orchestrator (started later) from its own wait, so the launcher's check fails first."""


def wait_for_replicas(
    children: Mapping[str, Child], configs: Mapping[str, InferenceConfig], supervisor: Supervisor, deadline: float
) -> None:
    """Return once every replica serves; a replica (or any supervised process) dying first, or the
    `time.monotonic()` `deadline` passing, raises ChildFailed."""
    for name, child in children.items():
        left = max(deadline - time.monotonic(), 1.0)  # a replica started beside the others may serve already
        try:
            wait_until_serving(child, configs[name].base_url, left, also_check=supervisor.check)
        except ChildFailed as e:
            if child.poll() is not None or time.monotonic() < deadline:
                raise
            raise ChildFailed(
                f"{e}\nThe run's inference start-up limit, {READY_TIMEOUT_KEY}, counted from the launch of the "
                f"inference servers, is spent: raise it if vLLM needs longer to start on this machine"
            ) from None
