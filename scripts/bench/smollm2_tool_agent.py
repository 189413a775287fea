"""The SmolLM2 tool-agent recipe per seed: held-back eval of the base model, `rl sft` on the
calculator demonstrations, then `rl` on configs/cpu/smollm2_tool_agent.toml; prints a table.

    flock /tmp/envrl-learn.lock uv run --no-sync python -m scripts.bench.smollm2_tool_agent \
        [--seeds 0 1 2] [--model deps/models/smollm2-135m] [--out outputs/tool_agent_seeds] \
        [--sft DIR] [--no-base-eval] [--rl-args "--max-async-level 0"]
    uv run --no-sync python -m scripts.bench.smollm2_tool_agent --score DIR [DIR ...] [--eval-rollouts 4]

The warm start is shared: `calculator.demos --seed 0` (96 conversations, about half of them
calling the tool) and `rl sft --seed 0` once (or `--sft DIR`, the output dir of an earlier one);
then per seed s, `rl --seed s` from the fine-tuned weights (eval at step 0, i.e. after SFT, and
after the last step), so the seeds vary RL: its sampling, its LoRA init and its task order. The
base model's eval runs once (`--base-eval`, on by default): the same config from the base weights
for one step, eval at start only; the eval tasks do not depend on the seed. Each line: eval
reward base / after SFT / after RL, the eval's tool calls per episode and valid-call share after
SFT and after RL, the median RL step (trainer ledger, steps after the first) and the wall time of
SFT and RL (a seed end to end is SFT + RL). `--score` runs only the held-back eval of each
weights dir given (a seed's `weights/final`, TRL's saved weights), `--eval-rollouts` times per
task (passes are not independent draws: a trained policy tends to miss the same tasks each
pass). Numbers go to docs/agents.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from statistics import fmean, median

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu" / "smollm2_tool_agent.toml"
ENV = "calculator"
SFT_ARGS = (
    "--epochs",
    "1",
    "--batch-size",
    "8",
    "--optim.lr",
    "2e-4",
    "--optim.schedule",
    "cosine",
    "--compile",
    "false",
)
"""The recipe's warm start (the config's header): one pass over 96 demonstrations, 12 steps."""
DEMOS = 96
EVAL_TASKS = tomllib.loads(CONFIG.read_text())["orchestrator"]["eval"]["env"][0]["num_examples"]
"""How many eval tasks the config's held-back eval scores."""


def run(argv: list[str], log: Path) -> float:
    """Run `argv` from the repo root, output to `log`; its wall seconds (SystemExit if it failed)."""
    started = time.monotonic()
    with log.open("w") as f:
        code = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited with {code}; see {log}")
    return time.monotonic() - started


def rl(out: Path, model: str, seed: int, *extra: str) -> float:
    """One `rl` run of the config on free ports (the box is shared); its wall seconds."""
    from tests.support.ports import free_base_port, free_port

    argv = [
        sys.executable, "-m", "envrl.launcher.main", "--config", str(CONFIG), "--model.name", model,
        "--output-dir", str(out), "--seed", str(seed), "--inference.port", str(free_port()),
        "--env-server-base-port", str(free_base_port()), "--wandb.mode", "disabled", "--clean", *extra,
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    return run(argv, out.parent / f"{out.name}.log")


def evals(out: Path) -> list[dict[str, float]]:
    """The run's eval records in step order."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if f"eval/{ENV}/reward" in m]


def calls_per_episode(out: Path, step: int) -> float:
    """Tool calls per episode of the eval at `step`, over every episode (the metric
    `metric/tool_calls` averages only the episodes that called)."""
    lines = (out / "rollouts" / "eval" / f"step_{step}.jsonl").read_text().splitlines()
    return fmean(json.loads(line)["metrics"].get("tool_calls", 0.0) for line in lines)


def held_back_eval(model: str, out: Path, rollouts: int = 1) -> dict[str, float]:
    """The config's held-back eval of the weights in `model`, `rollouts` per task (one `rl` step
    from them, eval at start only; the eval tasks do not depend on the seed): its reward, tool
    calls per episode and valid-call share."""
    tasks = [{"env": ENV, "num_examples": EVAL_TASKS, "rollouts_per_example": rollouts}]
    rl(out, model, 0, "--max-steps", "1", "--orchestrator.eval.no-at-end", "--orchestrator.eval.env", json.dumps(tasks))
    record = evals(out)[0]
    return {
        "reward": record[f"eval/{ENV}/reward"],
        "calls": calls_per_episode(out, record["step"]),
        "valid": record.get(f"eval/{ENV}/metric/valid_tool_call_share", 0.0),
    }


def step_seconds(out: Path) -> float:
    from envrl.report.timeline import step_splits
    from envrl.telemetry.ledger import read_ledger

    return median(s.wall for s in step_splits(read_ledger(out))[1:-1])


def warm_start(base: Path, model: str) -> tuple[Path, float]:
    """`rl sft` of the base model on the demonstrations of seed 0: its final weights and wall seconds."""
    demos = base / "demos.jsonl"
    run([sys.executable, "-m", "calculator.demos", "--out", str(demos), "--count", str(DEMOS), "--seed", "0"],
        base / "demos.log")  # fmt: skip
    sft_out = base / "sft"
    sft_s = run(
        [sys.executable, "-m", "envrl.launcher.main", "sft", "--model.name", model, "--data", str(demos),
         "--output-dir", str(sft_out), "--seed", "0", *SFT_ARGS],
        base / "sft.log",
    )  # fmt: skip
    return sft_out, sft_s


def seed_run(base: Path, sft_out: Path, seed: int, rl_args: list[str]) -> dict[str, float]:
    rl_out = base / f"rl_s{seed}"
    rl_s = rl(rl_out, str(sft_out / "weights" / "final"), seed, *rl_args)
    start, end = evals(rl_out)[0], evals(rl_out)[-1]
    key = f"eval/{ENV}"
    return {
        "sft": start[f"{key}/reward"],
        "rl": end[f"{key}/reward"],
        "calls_sft": calls_per_episode(rl_out, start["step"]),
        "calls_rl": calls_per_episode(rl_out, end["step"]),
        "valid_sft": start.get(f"{key}/metric/valid_tool_call_share", 0.0),
        "valid_rl": end.get(f"{key}/metric/valid_tool_call_share", 0.0),
        "step_s": step_seconds(rl_out),
        "rl_s": rl_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="none: the warm start only")
    parser.add_argument("--model", default="deps/models/smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "tool_agent_seeds")
    parser.add_argument("--no-base-eval", dest="base_eval", action="store_false")
    parser.add_argument("--sft", type=Path, help="an earlier warm start's output dir (skips demos and SFT)")
    parser.add_argument("--rl-args", default="", help="extra `rl` flags for every seed, one string")
    parser.add_argument("--score", type=Path, nargs="+", help="weights dirs: their held-back eval only")
    parser.add_argument("--eval-rollouts", type=int, default=1, help="--score: rollouts per eval task")
    args = parser.parse_args()
    if args.score:
        for i, weights in enumerate(args.score):
            r = held_back_eval(str(weights.resolve()), args.out / f"score_{i}", args.eval_rollouts)
            print(f"{weights}: eval reward {r['reward']:.3f} over {EVAL_TASKS} x {args.eval_rollouts}; tool calls "
                  f"per episode {r['calls']:.2f}; valid-call share {r['valid']:.2f}", flush=True)  # fmt: skip
        return
    model = str(Path(args.model).resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    base = float("nan")
    if args.base_eval:
        base = held_back_eval(model, args.out / "base")["reward"]
        print(f"base model: eval reward {base:.3f}", flush=True)
    sft_out, sft_s = (args.sft.resolve(), float("nan")) if args.sft else warm_start(args.out, model)
    print(f"warm start: {sft_out} (SFT {sft_s:.0f} s)", flush=True)
    rows = []
    for seed in args.seeds:
        r = seed_run(args.out, sft_out, seed, shlex.split(args.rl_args))
        rows.append(r)
        print(
            f"seed {seed}: eval reward base {base:.3f} / after SFT {r['sft']:.3f} / after RL {r['rl']:.3f} "
            f"(RL gain {r['rl'] - r['sft']:+.3f}, total {r['rl'] - base:+.3f}); tool calls per episode "
            f"{r['calls_sft']:.2f} -> {r['calls_rl']:.2f}; valid-call share {r['valid_sft']:.2f} -> {r['valid_rl']:.2f}; "
            f"RL step {r['step_s']:.1f} s (median); RL {r['rl_s']:.0f} s",
            flush=True,
        )
    if not rows:
        return
    gains = [r["rl"] - r["sft"] for r in rows]
    print(f"mean RL gain {fmean(gains):+.3f} over {len(rows)} seeds (min {min(gains):+.3f}); "
          f"mean after RL {fmean(r['rl'] for r in rows):.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
