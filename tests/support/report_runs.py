"""A small real run directory, written with the writers the run itself uses: train.jsonl lines,
a batch, metrics lines and the orchestrator config naming the tiny model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from envrl.data.layout import configs_dir, eval_results_file, eval_summary_file, logs_dir, train_rollouts_file
from envrl.data.rollout_lines import append_lines, trace_line
from envrl.data.samples import TrainingSample, write_batch
from envrl.data.traces import Branch, Error, Trace, Turn, TurnTokens, WireTask
from envrl.launcher import summary
from envrl.model.client import SamplingArgs
from envrl.orchestrator.trajectories import trace_to_samples
from envrl.telemetry.metrics import MetricsSink, WandbConfig

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "deps" / "models" / "tiny-chat"
ENV = "learnable"


def turn(prompt_ids: list[int], completion_ids: list[int]) -> Turn:
    tokens = TurnTokens(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        completion_logprobs=[-0.25 * (k + 1) for k in range(len(completion_ids))],
    )
    return Turn(
        prompt=[{"role": "user", "content": "count on"}],
        response={"role": "assistant", "content": "1 2"},
        tokens=tokens,
    )


def trace(task: int, *branches: list[int], reward: float | None = 0.5, error: str | None = None) -> Trace:
    """A trace whose branches each have one turn: prompt [1, task] then `branch` as completion."""
    if error is not None:
        return Trace.from_error(
            WireTask(idx=task), Error(type=error, message=f"{error} in task {task}", traceback="tb")
        )
    return Trace(
        task=WireTask(idx=task),
        branches=[Branch(turns=[turn([1, task], completion)]) for completion in branches],
        reward=reward,
        metrics={"digit_fraction": 0.5},
        stop_reason="completed",
    )


def samples_of(t: Trace, advantage: float = 0.5) -> list[TrainingSample]:
    return trace_to_samples(t, advantage=advantage, env=ENV, policy_step=0, sampling=SamplingArgs(max_tokens=8))


def write_step(out: Path, step: int, traces: list[Trace], samples: list[TrainingSample]) -> None:
    append_lines(train_rollouts_file(out), (trace_line(t, step=step, env=ENV, policy_step=0) for t in traces))
    write_batch(out, step, samples)


def write_metrics(out: Path, steps: int) -> None:
    for process in ("orchestrator", "trainer"):
        sink = MetricsSink(out / "metrics.jsonl", WandbConfig(mode="disabled"), process=process, output_dir=out)
        for step in range(steps):
            if process == "orchestrator":
                sink.log(step, {f"train/{ENV}/reward": 0.1 * step, "train/error_rate": 0.0, "inflight": 4})
            else:
                sink.log(step, {"trainer/mismatch_kl": 1e-3, "trainer/step_time_s": 0.5, "trainer/wait_time_s": 0.2})
        sink.close()


def write_config(out: Path) -> None:
    configs_dir(out).mkdir(parents=True, exist_ok=True)
    (configs_dir(out) / "orchestrator.toml").write_text(
        f'max_steps = 2\n[model]\nname = "{TINY_MODEL}"\n[[envs]]\nid = "{ENV}"\n'
    )


FAILED_LOG_TAIL = "RuntimeError: the trainer ran out of memory loading the model"


def write_failed_run(out: Path) -> None:
    """A run whose trainer died at start-up: its configs, its log and the launcher's summary.json,
    as `rl` leaves them (no metrics line, no rollouts)."""
    write_config(out)
    log = logs_dir(out) / "trainer.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"loading shard {k}\n" for k in range(100)) + FAILED_LOG_TAIL + "\n")
    outcome = summary.Outcome(
        status="failed",
        reason="process failed",
        failed_process="trainer",
        exit_code=1,
        failed_log=str(log),
        error="trainer (pid 4242) exited with code 1; last lines of the log follow",
    )
    summary.write(out, ["--config", "configs/rl/smoke.toml"], outcome, 12.5)


def write_eval_dir(out: Path, env: str = "reverse-text") -> list[Trace]:
    """The output dir of an `rl eval` of one env: its `eval/<env>.jsonl` and `eval/summary.json`."""
    traces = [trace(1, [300, 2], reward=1.0), trace(1, [301, 2], reward=0.0), trace(2, error="ConnectError")]
    lines = [trace_line(t, env=env, rollout=j % 2) for j, t in enumerate(traces)]
    append_lines(eval_results_file(out, env), lines)
    eval_summary_file(out).write_text(json.dumps({env: {"reward": 0.5, "error_rate": 1 / 3}}))
    return traces
