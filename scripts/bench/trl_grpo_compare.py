"""envrl vs TRL's GRPOTrainer, seconds per step on the SmolLM2 recipe's model, task and shapes.

    uv run --no-sync python -m scripts.bench.trl_grpo_compare [--steps 12] [--warmup 3]
        [--model deps/models/smollm2-135m] [--side both|envrl|trl]

envrl: `rl` on configs/cpu/smollm2_reverse_text.toml as it is (evals off, as TRL runs none),
each step from the trainer's ledger, with the median split of a steady step into the report's
parts (`envrl.report.timeline`: where a step's wall time went). TRL: `GRPOTrainer` with the
same work per step, read from the same TOML: `batch_size / group_size` prompts x `group_size`
completions (`num_generations`) of at most `sampling.max_tokens` tokens at the same
temperature, the same reverse-text tasks and reward (LCS ratio), LoRA of the same rank, alpha
and modules, the same lr and gradient clip, no KL (`beta` 0), token-level loss (`dapo`, envrl's
`normalize = "token"`), rewards unscaled. TRL generates with transformers (`use_vllm` off: TRL's
vLLM modes need a GPU) and then trains, in one process on every core; gradient checkpointing,
TRL's default, is off as in envrl. Its step is the time between `on_step_end` callbacks, of
which `_generate_and_score_completions` (generation, rewards, advantages) is timed apart.

TRL is never an envrl dependency: its side runs in a throwaway environment that `uv run
--isolated` builds from TRL, peft, the CPU torch the root pyproject pins (the `local-cpu-torch`
index, /opt/wheels) and envrl's base install with the reverse-text env (for the same tasks
and reward). Both sides report the median over steps after the first `--warmup` (start-up,
first compiles) and the ratio envrl / TRL is printed last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from itertools import pairwise
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "cpu" / "smollm2_reverse_text.toml"
TRL_VERSION = "1.16.0"
CPU_TORCH = "torch==2.13.0+cpu"
"""The CPU build the root pyproject pins for the `cpu` group (from its `local-cpu-torch` index)."""
CPU_TORCH_INDEX = "/opt/wheels"
RESULT = "TRL_STEP_TIMES "
"""Prefix of the one line the TRL side prints for this script to read."""


def recipe_shapes(recipe: Path) -> dict:
    """What both sides take from the recipe's TOML."""
    config = tomllib.loads(recipe.read_text())
    orch, trainer = config["orchestrator"], config["trainer"]
    return {
        "group": orch["group_size"],
        "batch": orch["batch_size"],
        "max_tokens": orch["sampling"]["max_tokens"],
        "temperature": orch["sampling"].get("temperature", 1.0),
        "env_args": orch["envs"][0].get("args", {}),
        "lora": trainer["lora"],
        "lr": trainer["optim"]["lr"],
        "max_grad_norm": trainer["optim"].get("max_grad_norm", 1.0),
        "seed": config.get("seed", 0),
    }


def run_envrl(model: str, steps: int, warmup: int, out: Path) -> dict[str, float]:
    """One `rl` run of the recipe; its median step and the median split of a steady step."""
    from envrl.report.timeline import step_splits
    from envrl.telemetry.ledger import read_ledger
    from tests.support.ports import free_base_port, free_port

    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(RECIPE), "--model.name", model,
        "--output-dir", str(out), "--max-steps", str(steps), "--orchestrator.eval.env", "[]",
        "--inference.port", str(free_port()), "--env-server-base-port", str(free_base_port()),
        "--wandb.mode", "disabled", "--clean",
    ]  # fmt: skip
    code = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
    if code != 0:
        raise SystemExit(f"rl exited with {code}; see {out}/logs")
    splits = step_splits(read_ledger(out))[warmup:-1]  # the last step also exports weights/final
    parts = {name: median(s.parts[name] for s in splits) for name in splits[0].parts}
    return {"step s": median(s.wall for s in splits), **{k: v for k, v in parts.items() if v >= 0.05}}


def run_trl(model: str, steps: int, warmup: int) -> dict[str, float]:
    """The TRL side in its own throwaway environment; its median step."""
    argv = [
        "uv", "run", "--no-project", "--isolated", "--find-links", CPU_TORCH_INDEX,
        "--with", CPU_TORCH, "--with", f"trl=={TRL_VERSION}", "--with", "peft",
        "--with-editable", str(ROOT), "--with-editable", str(ROOT / "deps" / "envs" / "reverse-text"),
        "python", "-m", "scripts.bench.trl_grpo_compare", "--trl-worker", "--model", model, "--steps", str(steps),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the TRL side exited with {proc.returncode}:\n{proc.stdout[-3000:]}")
    times = json.loads(lines[-1].removeprefix(RESULT))
    step, generation = median(times["steps"][warmup:]), median(times["generation"][warmup:])
    return {"step s": step, "generation": generation, "training": step - generation, "torch threads": times["threads"]}


def trl_worker(model: str, steps: int) -> None:
    """GRPOTrainer on the recipe's shapes (runs inside the TRL environment); prints the step times."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from reverse_text import SYSTEM_PROMPT, lcs_ratio, make_tasks
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    shapes = recipe_shapes(RECIPE)
    env = {"num_train": 1000, "min_len": 5, "max_len": 20, "seed": 0, **shapes["env_args"]}
    tasks = make_tasks(env["num_train"], env["seed"], env["min_len"], env["max_len"])
    rows = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.text}], "text": t.text}
            for t in tasks]  # fmt: skip

    def reward(completions: list[list[dict]], text: list[str], **_: object) -> list[float]:
        return [lcs_ratio(c[-1]["content"], t) for c, t in zip(completions, text, strict=True)]

    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, *args: object, **kwargs: object) -> None:
            ends.append(time.perf_counter())

    lora = shapes["lora"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=steps, per_device_train_batch_size=shapes["batch"],
            num_generations=shapes["group"], max_completion_length=shapes["max_tokens"],
            temperature=shapes["temperature"], learning_rate=shapes["lr"], max_grad_norm=shapes["max_grad_norm"],
            lr_scheduler_type="constant", beta=0.0, loss_type="dapo", scale_rewards="none", use_cpu=True, bf16=False,
            gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none", seed=shapes["seed"],
        )  # fmt: skip
        peft_config = LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"], task_type="CAUSAL_LM"
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows), peft_config=peft_config
        )
        trainer.add_callback(StepEnds())
        generating: list[float] = []
        generate = trainer._generate_and_score_completions  # generation, rewards, advantages

        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            result = generate(*args, **kwargs)
            generating.append(time.perf_counter() - start)
            return result

        trainer._generate_and_score_completions = timed
        start = time.perf_counter()
        trainer.train()
    steps = [b - a for a, b in pairwise([start, *ends])]
    print(
        RESULT + json.dumps({"steps": steps, "generation": generating, "threads": torch.get_num_threads()}), flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deps/models/smollm2-135m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the medians")
    parser.add_argument("--side", choices=["both", "envrl", "trl"], default="both")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    if args.trl_worker:
        trl_worker(model, args.steps)
        return
    shapes = recipe_shapes(RECIPE)
    print(
        f"{model}: {shapes['batch'] // shapes['group']} prompts x {shapes['group']} completions of <= "
        f"{shapes['max_tokens']} tokens a step, LoRA r{shapes['lora']['rank']}; medians of steps "
        f"{args.warmup}..{args.steps - 1}",
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    if args.side in ("both", "trl"):
        results["trl"] = run_trl(model, args.steps, args.warmup)
        trl = results["trl"]
        print(
            f"TRL {TRL_VERSION} GRPOTrainer: {trl['step s']:.2f} s/step (generation and scoring {trl['generation']:.2f}, "
            f"the rest {trl['training']:.2f}; {trl['torch threads']} torch threads)",
            flush=True,
        )
    if args.side in ("both", "envrl"):
        with tempfile.TemporaryDirectory() as tmp:
            results["envrl"] = run_envrl(model, args.steps + 1, args.warmup, Path(tmp) / "run")
        split = ", ".join(f"{k} {v:.2f}" for k, v in results["envrl"].items() if k != "step s")
        print(f"envrl: {results['envrl']['step s']:.2f} s/step (a steady step's split: {split})", flush=True)
    if len(results) == 2:
        print(f"envrl / TRL: {results['envrl']['step s'] / results['trl']['step s']:.2f}x")


if __name__ == "__main__":
    main()
