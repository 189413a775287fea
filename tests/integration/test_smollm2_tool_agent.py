"""The SmolLM2 tool-agent recipe (`configs/cpu/smollm2_tool_agent.toml`) runs end to end on a
cut-down SmolLM2: calculator demonstrations, `rl sft` on them (in this process), then `rl` on the
real config from the fine-tuned weights for a few steps, with LoRA, the eval at start and at end.

The cut-down model (`src/envrl/model/smollm2.py --cut-down`) carries the chat template the
converter gives the real one, so the tools are rendered into its prompts and its completions are
parsed for SmolLM2's `<tool_call>[...]</tool_call>` by the train client: before that template a
tool env on SmolLM2 failed every rollout (`UnknownToolFormat`). Whether SmolLM2-135M learns is
the recipe's own measurement (docs/agents.md); a random model calls no tool, so nothing here
thresholds learning or time.
"""

from __future__ import annotations

import json
from pathlib import Path

from calculator.demos import write_demos
from transformers import AutoTokenizer

from envrl.model.smollm2 import build_cut_down
from tests.integration.test_tool_agent import fine_tune
from tests.support.chaos_runs import ROOT
from tests.support.run_files import metric_lines
from tests.support.smoke import finish, rl_process, wait_no_survivors

RECIPE = ROOT / "configs" / "cpu" / "smollm2_tool_agent.toml"
STEPS = 2
EVAL = [{"env": "calculator", "num_examples": 4, "rollouts_per_example": 1}]


def test_the_tool_agent_recipe_trains_a_cut_down_smollm2_after_sft(tmp_path: Path) -> None:
    model = build_cut_down(tmp_path / "model")
    write_demos(tmp_path / "demos.jsonl", count=16, tool_share=0.5, seed=0)
    start = fine_tune(tmp_path / "demos.jsonl", tmp_path / "sft", "--model.name", str(model), "--epochs", "1")
    out = tmp_path / "run"
    overrides = (
        "--model.name", str(start), "--max-steps", str(STEPS), "--orchestrator.eval.env", json.dumps(EVAL),
        "--orchestrator.eval.interval", str(STEPS),
    )  # fmt: skip
    with rl_process(out, *overrides, config=RECIPE) as (proc, marker):
        code, console = finish(proc, timeout=600)
        assert code == 0, console[-3000:]
        assert not wait_no_survivors(marker)
    records = metric_lines(out)
    steps = [m for m in records if "train/reward" in m]
    assert [m["step"] for m in steps] == list(range(STEPS))
    assert all(m["train/error_rate"] == 0 for m in steps), steps  # the tools render and the completions parse
    evals = [m for m in records if "eval/calculator/reward" in m]
    assert [m["step"] for m in evals] == [0, STEPS] and all(m["eval/calculator/tasks"] == 4 for m in evals)
    rollout = json.loads((out / "rollouts" / "eval" / "step_0.jsonl").read_text().splitlines()[0])
    prompt = AutoTokenizer.from_pretrained(start).decode(rollout["branches"][0]["turns"][0]["tokens"]["prompt_ids"])
    assert "<tools>\ncalculate(expression: string): Evaluate" in prompt  # what the model saw, one line a tool
