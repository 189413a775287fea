"""The SmolLM2 recipe (`configs/cpu/smollm2_reverse_text.toml`) runs end to end on a cut-down
SmolLM2: the real config, env, LoRA targets and evals, with only the model's sizes changed (the
CI box cannot download SmolLM2-135M or afford its 24 minutes).

The cut-down model (`src/envrl/model/smollm2.py --cut-down`) keeps SmolLM2's architecture keys
(grouped-query attention 3:1, head_dim 64, tied embeddings, its chat template and pad = eos), so
what the recipe needs of the architecture (vLLM serving LoRA on it, the tied head, the template)
is exercised here; whether SmolLM2-135M learns is the recipe's own measurement (docs/trainer.md).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from transformers import AutoConfig

from envrl.model.smollm2 import CUT_DOWN_SIZES, build_cut_down, config_mismatches
from tests.support.chaos_runs import ROOT
from tests.support.run_files import metric_lines
from tests.support.smoke import run_to_end

RECIPE = ROOT / "configs" / "cpu" / "smollm2_reverse_text.toml"
STEPS = 5
INTERVAL = 2
"""Checkpoints (and kept HF policies) every this many steps."""
SIZES = {*CUT_DOWN_SIZES, "vocab_size"}
"""What the cut-down model changes (the vocabulary is the tiny tokenizer's)."""


def differing_keys(model: Path) -> set[str]:
    """The SmolLM2-135M config keys the model at `model` does not share."""
    return {line.split(":")[0] for line in config_mismatches(AutoConfig.from_pretrained(model))}


def test_the_cut_down_model_differs_from_smollm2_only_in_sizes(tmp_path: Path) -> None:
    assert differing_keys(build_cut_down(tmp_path / "model")) == SIZES


def test_the_smollm2_recipe_trains_a_cut_down_smollm2_with_lora(tmp_path: Path) -> None:
    model = build_cut_down(tmp_path / "model")
    out = tmp_path / "run"
    overrides = ("--model.name", str(model), "--max-steps", str(STEPS), "--trainer.ckpt.interval", str(INTERVAL))
    run_to_end(out, *overrides, config=RECIPE, timeout=900).check()
    records = metric_lines(out)
    assert sorted(m["step"] for m in records if "trainer/loss" in m) == list(range(STEPS))
    recipe = tomllib.loads(RECIPE.read_text())
    eval_env = recipe["orchestrator"]["eval"]["env"][0]
    evals = [m for m in records if f"eval/{eval_env['env']}/reward" in m]
    assert [m["step"] for m in evals] == [0, STEPS]  # at start and at end
    assert all(m[f"eval/{eval_env['env']}/tasks"] == eval_env["num_examples"] for m in evals)

    log = (out / "logs" / "inference.log").read_text()
    assert log.count("LoRA adapter hot-loaded from") >= STEPS - 1 and "weights reloaded from" not in log
    kept = sorted(int(d.name.removeprefix("step_")) for d in (out / "weights").glob("step_*"))
    assert INTERVAL in kept and STEPS in kept, kept  # a policy at every checkpoint, beyond the newest two
    adapter = json.loads((out / "weights" / f"step_{INTERVAL}" / "adapter_config.json").read_text())
    assert (adapter["r"], sorted(adapter["target_modules"])) == (
        recipe["trainer"]["lora"]["rank"],
        sorted(recipe["trainer"]["lora"]["target_modules"]),
    )
    final = out / "weights" / "final"
    assert differing_keys(final) == SIZES  # the merged export: a plain model of the same architecture
    assert json.loads((out / "summary.json").read_text())["final_weights"] == str(final.resolve())
