"""`launch_plan`: each process's command line and the environment it gets on top of `rl`'s."""

from pathlib import Path

from envrl.config import resolve_config
from envrl.launcher.commands import launch_plan
from envrl.launcher.config import RLConfig, resolve_run
from envrl.launcher.cpus import CpuPlan
from envrl.launcher.placement import place


def plan(tmp_path: Path, ranks: int, cpus: CpuPlan | None):
    rl = resolve_config(
        RLConfig,
        overrides=[
            ("orchestrator.envs", '[{"id": "reverse-text"}]'),
            ("output-dir", str(tmp_path)),
            ("trainer.num-procs", str(ranks)),
        ],
    )
    return launch_plan(resolve_run(rl), place(rl.trainer, rl.inference, None), cpus)


def test_pinned_ranks_split_the_trainers_cores_between_their_threads(tmp_path: Path) -> None:
    cpus = CpuPlan(inference=[0, 1], trainer=[2, 3, 4, 5])
    assert plan(tmp_path, 1, cpus).trainer.env["OMP_NUM_THREADS"] == "4"
    assert plan(tmp_path, 2, cpus).trainer.env["OMP_NUM_THREADS"] == "2"
    assert plan(tmp_path, 2, cpus).inference[0].env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}


def test_every_process_logs_under_the_run_and_reads_its_own_config(tmp_path: Path) -> None:
    commands = plan(tmp_path, 2, None).commands()
    assert [c.name for c in commands] == ["inference", "train env server 'reverse-text'", "trainer", "orchestrator"]
    for command in commands:
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
            ("inference.replicas", "2"),
            ("inference.gpus", "[0, 1]"),
        ],
    )
    commands = launch_plan(resolve_run(rl), place(rl.trainer, rl.inference, ["0", "1"], replicas=2), None).inference
    assert [c.name for c in commands] == ["inference-0", "inference-1"]
    assert [c.argv[-1] for c in commands] == [str(tmp_path / "configs" / f"inference-{i}.toml") for i in (0, 1)]
    assert [c.log_file.name for c in commands] == ["inference-0.log", "inference-1.log"]
    assert [c.env for c in commands] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
