"""digits-tools: digits-count with an MCP tool (a verifiers v1 taskset, written for verifiers).

Guarantee: the tasks and the reward are digits-count's (task i of a (seed, num_tasks) config is
always the same count start; reward = digits / non-space characters of the model's replies), and
every rollout also gets its own MCP tool server (`count_next_numbers`, tools.py) that verifiers
starts for the rollout and stops after it. `tool_calls` (a metric) counts the calls the model made.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf
from digits_count.taskset import DigitsData, DigitsTask

from digits_tools.tools import CountToolset

SYSTEM_PROMPT = "Continue the count. Answer with numbers only. The count_next_numbers tool can help."


class ToolsTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class DigitsToolsTask(DigitsTask, vf.Task[DigitsData, vf.State, ToolsTaskConfig]):
    @classmethod
    def toolsets(cls, config: ToolsTaskConfig) -> list[vf.Toolset]:
        return [CountToolset(config.tools)]

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class DigitsToolsConfig(vf.TasksetConfig):
    num_tasks: int = 256
    seed: int = 0
    task: ToolsTaskConfig = ToolsTaskConfig()


class DigitsToolsTaskset(vf.Taskset[DigitsToolsTask, DigitsToolsConfig]):
    def load(self) -> list[DigitsToolsTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            start = rng.randrange(0, 900)
            count = " ".join(str(n) for n in range(start, start + rng.randint(2, 5)))
            data = DigitsData(prompt=count, system_prompt=SYSTEM_PROMPT, start=start)
            tasks.append(DigitsToolsTask(data, self.config.task))
        return tasks
