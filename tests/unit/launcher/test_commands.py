"""The plan's commands: each process's command line and the environment it gets on top of `rl`'s."""

from pathlib import Path

from envrl.config import resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.plan.commands import RunCommands
from envrl.launcher.plan.run import Machine, plan

PINNED = Machine(cores=[0, 1, 2, 3, 4, 5], cpu_vllm=True)
"""A CPU-vLLM machine of 6 cores: `cpus.pin` gives inference the first half, the trainer the rest."""


def commands(tmp_path: Path, ranks: int, machine: Machine | None) -> RunCommands:
    rl = resolve_config(
        RLConfig,
        overrides=[
            ("orchestrator.envs", '[{"id": "reverse-text"}]'),
            ("output-dir", str(tmp_path)),
            ("placement.trainer.num-procs", str(ranks)),
            ("cpus.pin", "true"),
            ("cpus.inference", "[0, 1]"),
        ],
    )
    return plan(rl, machine=machine).commands


def test_pinned_ranks_split_the_trainers_cores_between_their_threads(tmp_path: Path) -> None:
    assert commands(tmp_path, 1, PINNED).trainer.env["OMP_NUM_THREADS"] == "4"
    assert commands(tmp_path, 2, PINNED).trainer.env["OMP_NUM_THREADS"] == "2"
    assert commands(tmp_path, 2, PINNED).inference[0].env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}


def test_every_process_logs_under_the_run_and_reads_its_own_config(tmp_path: Path) -> None:
    every = commands(tmp_path, 2, None).commands()
    assert [c.name for c in every] == ["inference", "train env server 'reverse-text'", "trainer", "orchestrator"]
    for command in every:
        assert command.log_file.is_relative_to(tmp_path / "logs")
        config = Path(command.argv[command.argv.index("--config") + 1])
        assert config.is_relative_to(tmp_path / "configs") and config.suffix == ".toml"
        # without devices or pinning only the trainer's thread count may differ (one thread under overlap)
        assert set(command.env) <= ({"OMP_NUM_THREADS"} if command.name == "trainer" else set())


def test_each_inference_replica_gets_its_own_config_log_and_devices(tmp_path: Path) -> None:
    rl = resolve_config(
        RLConfig,
        overrides=[
            ("orchestrator.envs", '[{"id": "reverse-text"}]'),
            ("output-dir", str(tmp_path)),
            ("placement.inference.replicas", "2"),
            ("placement.inference.gpus", "[0, 1]"),
        ],
    )
    inference = plan(rl, machine=Machine(visible_gpus=["0", "1"])).commands.inference
    assert [c.name for c in inference] == ["inference-0", "inference-1"]
    assert [c.argv[-1] for c in inference] == [str(tmp_path / "configs" / f"inference-{i}.toml") for i in (0, 1)]
    assert [c.log_file.name for c in inference] == ["inference-0.log", "inference-1.log"]
    assert [c.env for c in inference] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
