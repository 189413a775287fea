"""A verifiers (v1) taskset whose reward function raises after the model answered (test only).

Loaded as `verifiers:vf-raising` by an env server in the verifiers example's venv with this
directory on PYTHONPATH: verifiers imports a taskset id as a module.
"""

from __future__ import annotations

import verifiers.v1 as vf

MESSAGE = "vf-raising: the reward function raised on purpose"


class RaisingTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def broken(self, trace: vf.Trace) -> float:
        raise RuntimeError(MESSAGE)


class RaisingTaskset(vf.Taskset[RaisingTask, vf.TasksetConfig]):
    def load(self) -> list[RaisingTask]:
        return [RaisingTask(vf.TaskData(prompt=f"Say {i}."), self.config.task) for i in range(2)]


__all__ = ["RaisingTaskset"]
