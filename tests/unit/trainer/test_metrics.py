"""The metrics sink: one JSON line per log call, mirrored to an offline wandb run."""

import json

from envrl.telemetry.metrics import MetricsSink, WandbConfig


def test_each_log_call_appends_one_json_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = MetricsSink(path, WandbConfig(mode="disabled"), process="trainer", output_dir=tmp_path)
    sink.log(0, {"trainer/loss": 0.5, "trainer/grad_norm": float("nan")})
    sink.log(1, {"trainer/loss": 0.25})
    sink.close()
    other = MetricsSink(path, WandbConfig(mode="disabled"), process="orchestrator", output_dir=tmp_path)
    other.log(1, {"orchestrator/reward": 1.0})
    other.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 1]
    assert lines[0]["trainer/loss"] == 0.5 and lines[0]["trainer/grad_norm"] == "nan"
    assert lines[2]["orchestrator/reward"] == 1.0 and "time" in lines[2]


def test_offline_wandb_run_is_written_under_the_output_dir(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sink = MetricsSink(
        tmp_path / "metrics.jsonl",
        WandbConfig(mode="offline", dir=tmp_path / "run"),
        process="trainer",
        output_dir=tmp_path,
        config={"lr": 1e-3},
    )
    sink.log(0, {"trainer/loss": 0.5})
    sink.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_a_resumed_sink_drops_its_own_lines_of_later_steps_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    trainer = MetricsSink(path, WandbConfig(mode="disabled"), process="trainer", output_dir=tmp_path)
    orchestrator = MetricsSink(path, WandbConfig(mode="disabled"), process="orchestrator", output_dir=tmp_path)
    for step in range(4):
        trainer.log(step, {"trainer/loss": step})
        orchestrator.log(step, {"train/reward": step})
    with path.open("a") as f:
        f.write('{"step": 4, "process": "orchestr')  # a crash mid-write
    resumed = MetricsSink(path, WandbConfig(mode="disabled"), process="trainer", output_dir=tmp_path, resume_step=2)
    resumed.log(2, {"trainer/loss": 2.5})
    orchestrator.log(4, {"train/reward": 4})  # opened before the rewrite: still lands in the file
    for sink in (trainer, orchestrator, resumed):
        sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["process"], r["step"]) for r in lines if r["process"] == "trainer"] == [
        ("trainer", 0),
        ("trainer", 1),
        ("trainer", 2),
    ]
    assert [r["step"] for r in lines if r["process"] == "orchestrator"] == [0, 1, 2, 3, 4]


def test_wandb_is_off_by_default_and_a_bare_flag_turns_it_on() -> None:
    from envrl.config import load_config
    from envrl.launcher.config import RLConfig

    envs = ["--orchestrator.envs", '[{"id": "reverse-text"}]']
    assert load_config(RLConfig, envs, prog="rl").wandb.mode == "disabled"
    on = load_config(RLConfig, [*envs, "--wandb", "--wandb.project", "p", "--wandb.name", "n"], prog="rl").wandb
    assert (on.mode, on.project, on.name) == ("online", "p", "n")


def test_an_offline_wandb_run_gets_a_table_of_eval_samples(tmp_path, monkeypatch):
    from envrl.data.traces import Branch, Trace, Turn, WireTask

    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    turn = Turn(prompt=[{"role": "user", "content": "reverse abc"}], response={"role": "assistant", "content": "cba"})
    traces = [Trace(task=WireTask(idx=i), branches=[Branch(turns=[turn])], reward=1.0) for i in range(10)]
    sink = MetricsSink(
        tmp_path / "metrics.jsonl", WandbConfig(mode="offline", dir=tmp_path / "run"), process="orchestrator",
        output_dir=tmp_path,
    )  # fmt: skip
    sink.log_samples(3, "eval/rev/samples", traces)
    sink.close()
    [table] = (tmp_path / "run" / "wandb").glob("offline-run-*/files/media/table/eval/rev/samples_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["prompt", "completion", "reward", "stop_reason", "error"]
    assert len(data["data"]) == 8 and data["data"][0][:3] == ["reverse abc", "cba", 1.0]
