"""envrl vs TRL's GRPOTrainer, seconds per step on a SmolLM2 recipe's model, task and shapes.

    uv run --no-sync python -m scripts.bench.trl_grpo_compare [--steps 12] [--warmup 3]
        [--model deps/models/smollm2-135m] [--side both|envrl|trl] [--recipe reverse-text|tool-agent]
        [--rl-args="--max-async-level 0"] [--seed N] [--out DIR]

`--recipe tool-agent` compares on configs/cpu/smollm2_tool_agent.toml (the calculator env, with
its `calculate` tool; `--model` then names the SFT warm start both sides begin from): TRL gets the
same tool as a function (`tools=`), SmolLM2's tool-call syntax as a `response_template`
(`TOOL_RESPONSE_TEMPLATE`; TRL knows no SmolLM2 template), `max_tool_calling_iterations` =
`max_turns - 1` and a completion budget of `max_tokens x max_turns` (TRL's budget is per episode,
envrl's per turn). Both sides also print their train reward per step, first steps to last; TRL's
side also its tool calls per episode and failed-call share per step (TRL's `tools/*` logs).
`--save DIR` merges TRL's LoRA into the weights at the end (DIR/final) and, for the tool agent,
scores them with envrl's held-back eval (`smollm2_tool_agent.held_back_eval`: the same 48 eval
tasks as the recipe's seeds); `--stop-by` (Unix time) ends TRL's training early, keeping its steps.
`--out DIR` keeps both sides' curves: envrl's run in DIR/envrl, TRL's steps as DIR/trl/metrics.jsonl
(the shape of an `rl` run's: `train/<env>/reward` per step), drawn together in DIR/compare.png and
DIR/compare.md (`rl report --compare`, which also adds other runs, e.g. more seeds, to the picture).

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
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {
    "reverse-text": ROOT / "configs" / "cpu" / "smollm2_reverse_text.toml",
    "tool-agent": ROOT / "configs" / "cpu" / "smollm2_tool_agent.toml",
}
ENV_DIRS = {"reverse-text": "reverse-text", "tool-agent": "calculator"}
"""The example env each recipe trains on (deps/envs/<dir>), installed into TRL's environment."""
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>[",
            "close_pattern": r"\]</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""SmolLM2's `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>` for transformers'
response parser (a `response_template`, as TRL's own for Qwen 3): one call per tag, which is
what the demonstrations teach; a tag holding several calls does not parse on TRL's side."""
TRL_VERSION = "1.16.0"
CPU_TORCH = "torch==2.13.0+cpu"
"""The CPU build the root pyproject pins for the `cpu` group (from its `local-cpu-torch` index)."""
CPU_TORCH_INDEX = "/opt/wheels"
STEP_LOGS = ("reward", "tools/call_frequency", "tools/failure_frequency", "completions/mean_length")
"""What TRL logs of a step that the TRL side records: train reward, tool calls per episode (the
calls TRL parsed and ran), the share of those that raised, completion tokens per episode."""
RESULT = "TRL_STEP_TIMES "
"""Prefix of the one line the TRL side prints for this script to read."""


def recipe_shapes(recipe: str) -> dict:
    """What both sides take from the recipe's TOML."""
    config = tomllib.loads(RECIPES[recipe].read_text())
    orch, trainer = config["orchestrator"], config["trainer"]
    return {
        "group": orch["group_size"],
        "batch": orch["batch_size"],
        "max_tokens": orch["sampling"]["max_tokens"],
        "temperature": orch["sampling"].get("temperature", 1.0),
        "env": orch["envs"][0].get("name", orch["envs"][0]["id"]),
        "env_args": orch["envs"][0].get("args", {}),
        "lora": trainer["lora"],
        "lr": trainer["optim"]["lr"],
        "max_grad_norm": trainer["optim"].get("max_grad_norm", 1.0),
        "seed": config.get("seed", 0),
    }


def run_envrl(
    recipe: str, model: str, steps: int, warmup: int, out: Path, rl_args: list[str], seed: int
) -> dict[str, float]:
    """One `rl` run of the recipe (plus `rl_args`); its median step, the median split of a steady
    step and the train reward per step."""
    from envrl.report.timeline import step_splits
    from envrl.telemetry.ledger import read_ledger
    from tests.support.ports import free_base_port, free_port

    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(RECIPES[recipe]), "--model.name", model,
        "--output-dir", str(out), "--max-steps", str(steps), "--orchestrator.eval.env", "[]",
        "--inference.port", str(free_port()), "--env-server-base-port", str(free_base_port()),
        "--wandb.mode", "disabled", "--clean", "--seed", str(seed), *rl_args,
    ]  # fmt: skip
    code = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
    if code != 0:
        raise SystemExit(f"rl exited with {code}; see {out}/logs")
    splits = step_splits(read_ledger(out))[warmup:-1]  # the last step also exports weights/final
    parts = {name: median(s.parts[name] for s in splits) for name in splits[0].parts}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["train/reward"] for m in lines if "train/reward" in m]
    return {
        "step s": median(s.wall for s in splits),
        **{k: v for k, v in parts.items() if v >= 0.05},
        "rewards": rewards,
    }


def write_trl_metrics(per_step: list[dict[str, float]], env: str, out: Path) -> None:
    """TRL's per-step logs as `out/metrics.jsonl` in an `rl` run's shape (`train/<env>/reward`,
    `train/reward`; TRL's other logs under `trl/`), so `rl report --compare` draws it beside envrl's."""
    from envrl.data.layout import metrics_file

    lines = []
    for step, record in enumerate(per_step):
        line: dict[str, object] = {"step": step, "process": "trl"}
        if "reward" in record:
            line |= {f"train/{env}/reward": record["reward"], "train/reward": record["reward"]}
        line |= {f"trl/{key}": value for key, value in record.items() if key != "reward"}
        lines.append(json.dumps(line))
    path = metrics_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


def run_trl(recipe: str, model: str, steps: int, warmup: int, save: Path | None, stop_by: float, seed: int) -> dict:
    """The TRL side in its own throwaway environment; its median step, train reward per step and
    the per-step records of `trl_worker`."""
    argv = [
        "uv", "run", "--no-project", "--isolated", "--find-links", CPU_TORCH_INDEX,
        "--with", CPU_TORCH, "--with", f"trl=={TRL_VERSION}", "--with", "peft",
        "--with-editable", str(ROOT), "--with-editable", str(ROOT / "deps" / "envs" / ENV_DIRS[recipe]),
        "python", "-m", "scripts.bench.trl_grpo_compare", "--trl-worker", "--model", model, "--steps", str(steps),
        "--recipe", recipe, "--stop-by", str(stop_by), "--seed", str(seed), *(["--save", str(save)] if save else []),
    ]  # fmt: skip
    # A throwaway environment: compiling its ~12,000 files' bytecode (the root pyproject's
    # `compile-bytecode`) took 2.5 min of the 2-core box before every run.
    env = {**os.environ, "UV_COMPILE_BYTECODE": "0"}
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the TRL side exited with {proc.returncode}:\n{proc.stdout[-3000:]}")
    times = json.loads(lines[-1].removeprefix(RESULT))
    kept = times["steps"][warmup:] or times["steps"]  # a run stopped early keeps its only steps
    step = median(kept)
    generation = median(times["generation"][warmup : warmup + len(kept)] or times["generation"])
    return {
        "step s": step, "generation": generation, "training": step - generation, "torch threads": times["threads"],
        "rewards": times["rewards"], "per step": times["per_step"],
    }  # fmt: skip


def reverse_text_task(shapes: dict) -> tuple[list[dict], Callable[..., list[float]], dict, dict]:
    """TRL's dataset rows, reward, trainer and config extras for the reverse-text recipe."""
    from reverse_text import SYSTEM_PROMPT, lcs_ratio, make_tasks

    env = {"num_train": 1000, "min_len": 5, "max_len": 20, "seed": 0, **shapes["env_args"]}
    tasks = make_tasks(env["num_train"], env["seed"], env["min_len"], env["max_len"])
    rows = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.text}], "text": t.text}
            for t in tasks]  # fmt: skip

    def reward(completions: list[list[dict]], text: list[str], **_: object) -> list[float]:
        return [lcs_ratio(c[-1]["content"], t) for c, t in zip(completions, text, strict=True)]

    return rows, reward, {}, {"max_completion_length": shapes["max_tokens"]}


def tool_agent_task(shapes: dict, model: str) -> tuple[list[dict], Callable[..., list[float]], dict, dict]:
    """The same for the tool-agent recipe: the calculator's tasks, reward and tool."""
    from calculator import Calculator, correct, make_tasks
    from transformers import AutoTokenizer

    env = {"num_train": 1000, "seed": 0, "max_turns": 3, **shapes["env_args"]}
    tasks = make_tasks(env["num_train"], env["seed"])
    rows = [{"prompt": [{"role": "user", "content": t.prompt}], "a": t.a, "b": t.b} for t in tasks]

    def reward(completions: list[list[dict]], a: list[int], b: list[int], **_: object) -> list[float]:
        return [correct(c[-1].get("content") or "", x, y) for c, x, y in zip(completions, a, b, strict=True)]

    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression of integers with +, -, * and parentheses.

        Args:
            expression: the arithmetic to evaluate, written out in full.
        """
        return Calculator().calculate(expression)

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    trainer_extras = {"tools": [calculate], "processing_class": tokenizer}
    config_extras = {
        "max_completion_length": shapes["max_tokens"] * env["max_turns"],
        "max_tool_calling_iterations": env["max_turns"] - 1,
    }
    return rows, reward, trainer_extras, config_extras


def trl_worker(recipe: str, model: str, steps: int, save: Path | None, stop_by: float, seed: int) -> None:
    """GRPOTrainer on the recipe's shapes (runs inside the TRL environment); prints the step times
    and, per step, what TRL logs of it. Training stops after the step past which another step of the
    same length would end after `stop_by` (Unix seconds); `save`: the LoRA merged into the model's
    weights at the end, with its tokenizer, in `save/final`."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback, TrainerControl
    from trl import GRPOConfig, GRPOTrainer

    shapes = {**recipe_shapes(recipe), "seed": seed}
    if recipe == "tool-agent":
        rows, reward, trainer_extras, config_extras = tool_agent_task(shapes, model)
    else:
        rows, reward, trainer_extras, config_extras = reverse_text_task(shapes)

    ends: list[float] = []
    rewards: list[float] = []
    per_step: list[dict[str, float]] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args: object, state: object, control: TrainerControl, **kwargs: object) -> None:
            ends.append(time.perf_counter())
            last = ends[-1] - (ends[-2] if len(ends) > 1 else start)
            if time.time() + last > stop_by:
                print(f"TRL: stopping after step {len(ends)}: another would end past --stop-by", file=sys.stderr)
                control.should_training_stop = True

        def on_log(self, *args: object, logs: dict | None = None, **kwargs: object) -> None:
            if logs and "reward" in logs:
                rewards.append(logs["reward"])
                wall = ends[-1] - (ends[-2] if len(ends) > 1 else start)
                record = {"step s": wall, **{k: logs[k] for k in STEP_LOGS if k in logs}}
                per_step.append(record)
                # progress on stderr (not read by the parent): a run cut short still shows its steps
                print(f"TRL step {len(ends) - 1}: {json.dumps(record)}", file=sys.stderr)

    lora = shapes["lora"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=steps, per_device_train_batch_size=shapes["batch"],
            num_generations=shapes["group"], **config_extras,
            temperature=shapes["temperature"], learning_rate=shapes["lr"], max_grad_norm=shapes["max_grad_norm"],
            lr_scheduler_type="constant", beta=0.0, loss_type="dapo", scale_rewards="none", use_cpu=True, bf16=False,
            gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none", seed=shapes["seed"],
        )  # fmt: skip
        peft_config = LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"], task_type="CAUSAL_LM"
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows), peft_config=peft_config,
            **trainer_extras,
        )  # fmt: skip
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
    result = {"steps": steps, "generation": generating, "threads": torch.get_num_threads(), "rewards": rewards}
    print(RESULT + json.dumps({**result, "per_step": per_step}), flush=True)
    if save:
        final = save / "final"
        trainer.model.merge_and_unload().save_pretrained(final)
        AutoTokenizer.from_pretrained(model).save_pretrained(final)  # the chat template with tools
        print(f"TRL: weights after {len(steps)} steps in {final}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deps/models/smollm2-135m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the medians")
    parser.add_argument("--side", choices=["both", "envrl", "trl"], default="both")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="reverse-text")
    parser.add_argument(
        "--save", type=Path, help="TRL's final weights go to SAVE/final (tool-agent: then its held-back eval)"
    )
    parser.add_argument(
        "--stop-by", type=float, default=float("inf"),
        help="Unix time: TRL stops after the step past which another would end later (its weights still saved)",
    )  # fmt: skip
    parser.add_argument("--rl-args", default="", help="extra `rl` flags for envrl's side, one string")
    parser.add_argument("--out", type=Path, help="keep both sides' runs and curves here (compare.png, compare.md)")
    parser.add_argument("--seed", type=int, help="both sides' seed (TRL's `seed`, `rl --seed`); default: the recipe's")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    save = args.save.resolve() if args.save else None
    shapes = recipe_shapes(args.recipe)
    seed = shapes["seed"] if args.seed is None else args.seed
    if args.trl_worker:
        trl_worker(args.recipe, model, args.steps, save, args.stop_by, seed)
        return
    print(
        f"{model}: {shapes['batch'] // shapes['group']} prompts x {shapes['group']} completions of <= "
        f"{shapes['max_tokens']} tokens a step, LoRA r{shapes['lora']['rank']}; medians of steps "
        f"{args.warmup}..{args.steps - 1}, seed {seed}",
        flush=True,
    )
    results: dict[str, dict] = {}
    if args.side in ("both", "trl"):
        results["trl"] = run_trl(args.recipe, model, args.steps, args.warmup, save, args.stop_by, seed)
        trl = results["trl"]
        if args.out:
            write_trl_metrics(trl["per step"], shapes["env"], args.out / "trl")
        print(
            f"TRL {TRL_VERSION} GRPOTrainer: {trl['step s']:.2f} s/step (generation and scoring {trl['generation']:.2f}, "
            f"the rest {trl['training']:.2f}; {trl['torch threads']} torch threads)",
            flush=True,
        )
        for i, record in enumerate(trl["per step"]):
            print(f"TRL step {i}: " + ", ".join(f"{k} {v:.3f}" for k, v in record.items()), flush=True)
        if save and args.recipe == "tool-agent":
            from scripts.bench.smollm2_tool_agent import held_back_eval

            held = held_back_eval(str(save / "final"), save / "eval")
            print(
                f"TRL's final weights, envrl's held-back eval: reward {held['reward']:.3f}, tool calls per episode "
                f"{held['calls']:.2f}, valid-call share {held['valid']:.2f}",
                flush=True,
            )
    if args.side in ("both", "envrl"):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = args.out / "envrl" if args.out else Path(tmp) / "run"
            results["envrl"] = run_envrl(
                args.recipe, model, args.steps + 1, args.warmup, run_dir, shlex.split(args.rl_args), seed
            )
        split = ", ".join(f"{k} {v:.2f}" for k, v in results["envrl"].items() if k not in ("step s", "rewards"))
        print(f"envrl: {results['envrl']['step s']:.2f} s/step (a steady step's split: {split})", flush=True)
    for side, result in results.items():
        rewards = result["rewards"]
        print(f"{side} train reward by step: {[round(r, 3) for r in rewards]}", flush=True)
    if len(results) == 2:
        print(f"envrl / TRL: {results['envrl']['step s'] / results['trl']['step s']:.2f}x")
    if args.out:
        from envrl.report.compare import write_comparison

        runs = [args.out / side for side in results]
        labels = [{"trl": f"TRL {TRL_VERSION}", "envrl": "envrl"}[side] for side in results]
        print(f"curves: {write_comparison(runs, args.out, labels)}")


if __name__ == "__main__":
    main()
