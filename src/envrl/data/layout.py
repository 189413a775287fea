"""The run directory's layout: every path under `<output_dir>` is named here once and built nowhere else,
and a `step_<n>` directory exists only when complete (writers rename it into place)."""

from __future__ import annotations

import re
from pathlib import Path

from envrl.data.traces import Split

_STEP_DIR = re.compile(r"step_(\d+)")
_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")


def run_marker_file(output_dir: Path) -> Path:
    """`rl`'s claim on the dir, the proof that `--clean` may delete the run in it: `<output_dir>/.envrl-run.json`."""
    return Path(output_dir) / ".envrl-run.json"


def logs_dir(output_dir: Path) -> Path:
    """One log file per process: `<output_dir>/logs/`."""
    return Path(output_dir) / "logs"


def process_log_file(output_dir: Path, process: str) -> Path:
    """The log of process `process` (`launcher`, `trainer`, `trainer-node1`, `sft`, ...): `<output_dir>/logs/<process>.log`."""
    return logs_dir(output_dir) / f"{process}.log"


def steps_log_file(output_dir: Path) -> Path:
    """One line per step, as the console showed it: `<output_dir>/logs/steps.log`."""
    return logs_dir(output_dir) / "steps.log"


def env_log_dir(output_dir: Path, split: Split) -> Path:
    """Env server logs, one `<env>.log` per server: `<output_dir>/logs/envs/<split>/`."""
    return logs_dir(output_dir) / "envs" / split


def env_log_file(output_dir: Path, split: Split, env: str) -> Path:
    """The log of env `env`'s server: `<output_dir>/logs/envs/<split>/<env>.log`."""
    return env_log_dir(output_dir, split) / f"{env}.log"


def curve_dir(output_dir: Path) -> Path:
    """The CURVE keys of the run's env servers and their client: `<output_dir>/curve/` (0700)."""
    return Path(output_dir) / "curve"


def stall_dump_file(output_dir: Path, step: int) -> Path:
    """Where every role was when step `step` stalled (orchestrator/watchdog.py): `<output_dir>/logs/stalls/step_<n>.txt`."""
    return logs_dir(output_dir) / "stalls" / f"step_{step}.txt"


def configs_dir(output_dir: Path) -> Path:
    """Each process's resolved config as TOML: `<output_dir>/configs/`."""
    return Path(output_dir) / "configs"


def env_server_process(split: Split, env: str) -> str:
    """How env `env`'s server is named among the run's processes (its config file): `envs/<split>/<env>`."""
    return f"envs/{split}/{env}"


def process_config_file(output_dir: Path, process: str) -> Path:
    """The resolved config of process `process` (`trainer`, `envs/train/<env>`, ...): `<output_dir>/configs/<process>.toml`."""
    return configs_dir(output_dir) / f"{process}.toml"


def user_config_file(output_dir: Path) -> Path:
    """The run's own config as the user gave it (resolved): `<output_dir>/configs/rl.toml`."""
    return process_config_file(output_dir, "rl")


def summary_file(output_dir: Path) -> Path:
    """What one `rl` run did, written when it ends (`envrl.data.summary`): `<output_dir>/summary.json`."""
    return Path(output_dir) / "summary.json"


def slurm_dir(output_dir: Path) -> Path:
    """The SLURM job's stored config and batch script: `<output_dir>/slurm/`."""
    return Path(output_dir) / "slurm"


def slurm_config_file(output_dir: Path) -> Path:
    """The run's config as the SLURM job reads it: `<output_dir>/slurm/rl.toml`."""
    return slurm_dir(output_dir) / "rl.toml"


def slurm_script_file(output_dir: Path) -> Path:
    """The SLURM batch script `rl --slurm` writes: `<output_dir>/slurm/job.sbatch`."""
    return slurm_dir(output_dir) / "job.sbatch"


def host_recoveries_dir(output_dir: Path) -> Path:
    """Each SLURM job host's restarts and failure, for `summary.json` (`envrl.data.host_recoveries`): `<output_dir>/slurm/recoveries/`."""
    return slurm_dir(output_dir) / "recoveries"


def host_recoveries_file(output_dir: Path, host: int) -> Path:
    """Host `host`'s recoveries and failure: `<output_dir>/slurm/recoveries/host<host>.json`."""
    return host_recoveries_dir(output_dir) / f"host{host}.json"


def inference_work_dir(output_dir: Path) -> Path:
    """The inference server's working files (rpc sockets, caches, tmp): `<output_dir>/inference/`."""
    return Path(output_dir) / "inference"


def metrics_file(output_dir: Path) -> Path:
    """Trainer and orchestrator metrics, one JSON object per line: `<output_dir>/metrics.jsonl`."""
    return Path(output_dir) / "metrics.jsonl"


def ledger_dir(output_dir: Path) -> Path:
    """The time ledgers, one `<writer>.jsonl` per process: `<output_dir>/ledger/`."""
    return Path(output_dir) / "ledger"


def ledger_file(output_dir: Path, writer: str) -> Path:
    """The time ledger of process `writer`, one span per JSON line: `<output_dir>/ledger/<writer>.jsonl`
    (every `*.jsonl` there is one writer's: `envrl.telemetry.ledger.read_ledger` reads them all)."""
    return ledger_dir(output_dir) / f"{writer}.jsonl"


def rollouts_root(output_dir: Path) -> Path:
    """Batches (`step_<n>/`) and rollout logs: `<output_dir>/rollouts/`."""
    return Path(output_dir) / "rollouts"


def train_rollouts_file(output_dir: Path) -> Path:
    """Every train Trace as a JSON line: `<output_dir>/rollouts/train.jsonl`."""
    return rollouts_root(output_dir) / "train.jsonl"


def eval_rollouts_root(output_dir: Path) -> Path:
    """The orchestrator's eval rollout logs, one `step_<n>.jsonl` each: `<output_dir>/rollouts/eval/`."""
    return rollouts_root(output_dir) / "eval"


def eval_rollouts_file(output_dir: Path, step: int) -> Path:
    """Every Trace of the evals at `step`: `<output_dir>/rollouts/eval/step_<step>.jsonl`."""
    return eval_rollouts_root(output_dir) / f"step_{step}.jsonl"


def eval_rollouts_files(output_dir: Path) -> dict[int, Path]:
    """Every `rollouts/eval/step_<n>.jsonl` there is, by step."""
    root = eval_rollouts_root(output_dir)
    files = root.glob("step_*.jsonl") if root.is_dir() else []
    return {int(m.group(1)): f for f in files if (m := _STEP_FILE.fullmatch(f.name))}


def eval_results_root(output_dir: Path) -> Path:
    """The `eval` command's results, one `<env>.jsonl` per env and `summary.json`: `<output_dir>/eval/`."""
    return Path(output_dir) / "eval"


def eval_results_file(output_dir: Path, env: str) -> Path:
    """One line per (task, rollout) pair of env `env`'s eval grid: `<output_dir>/eval/<env>.jsonl`."""
    return eval_results_root(output_dir) / f"{env}.jsonl"


def eval_summary_file(output_dir: Path) -> Path:
    """The `eval` command's summary per env: `<output_dir>/eval/summary.json`."""
    return eval_results_root(output_dir) / "summary.json"


def report_dir(output_dir: Path) -> Path:
    """The run report (`rl report`): plots, `index.html` and per-step trace files: `<output_dir>/report/`."""
    return Path(output_dir) / "report"


def report_index_file(output_dir: Path) -> Path:
    """The report's page: `<output_dir>/report/index.html`."""
    return report_dir(output_dir) / "index.html"


def report_plots_dir(output_dir: Path) -> Path:
    """The report's plots, one `<plot>.png` each: `<output_dir>/report/plots/`."""
    return report_dir(output_dir) / "plots"


def report_timeline_file(output_dir: Path) -> Path:
    """The run's ledger as a Chrome trace: `<output_dir>/report/timeline.json`."""
    return report_dir(output_dir) / "timeline.json"


def report_manifest_file(output_dir: Path) -> Path:
    """Which per-step trace files are up to date, by step: `<output_dir>/report/steps/manifest.json`."""
    return report_dir(output_dir) / "steps" / "manifest.json"


def report_step_file(output_dir: Path, step: int) -> Path:
    """The traces of step `step` as the page loads them: `<output_dir>/report/steps/step_<step>.js`."""
    return report_dir(output_dir) / "steps" / f"step_{step}.js"


def weights_root(output_dir: Path) -> Path:
    """Published policies, one `step_<n>/` each: `<output_dir>/weights/`."""
    return Path(output_dir) / "weights"


def checkpoints_root(output_dir: Path) -> Path:
    """Trainer states, one `step_<n>/` each: `<output_dir>/checkpoints/`."""
    return Path(output_dir) / "checkpoints"


def abandoned_checkpoints_dir(output_dir: Path) -> Path:
    """Checkpoints a resumed run set aside (it went back to an earlier step): `<output_dir>/checkpoints/abandoned/`."""
    return checkpoints_root(output_dir) / "abandoned"


def batch_dir(output_dir: Path, step: int) -> Path:
    """Where trainer step `step` reads its samples: `<output_dir>/rollouts/step_<step>/`."""
    return rollouts_root(output_dir) / f"step_{step}"


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    """The trainer's full state after `step` completed steps: `<output_dir>/checkpoints/step_<step>/`."""
    return checkpoints_root(output_dir) / f"step_{step}"


def final_weights_dir(output_dir: Path) -> Path:
    """The run's final policy as a plain HF model, kept for good: `<output_dir>/weights/final/`."""
    return weights_root(output_dir) / "final"


def weights_dir(output_dir: Path, step: int) -> Path:
    """Where policy `step` is published: `<output_dir>/weights/step_<step>/`."""
    return weights_root(output_dir) / f"step_{step}"


def published_steps(root: Path) -> list[int]:
    """Steps of the complete `step_<n>` directories under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir())
