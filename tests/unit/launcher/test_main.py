"""`rl` as a command: subcommands dispatch, and a run's config problems stop it before anything starts."""

import importlib
import socket
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.main import COMMANDS, _check_devices, main
from envrl.launcher.run_dir import MARKER

ONE_ENV = ["--orchestrator.envs", '[{"id": "reverse-text"}]']


def test_rl_eval_runs_the_eval_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    assert "--num-examples, -n" in capsys.readouterr().out


def test_every_command_names_a_module_with_a_main() -> None:
    for name, module in COMMANDS.items():
        assert callable(importlib.import_module(module).main), name


def test_an_unknown_command_exits_2_naming_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["evl", "--env.id", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'evl'" in err and "did you mean 'rl eval'?" in err


def test_rl_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--orchestrator.batch-size" in out and "rl eval --help" in out


def test_dry_run_prints_every_process_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--dry-run"])
    assert exit_info.value.code == 0
    # (a "# warning: port ... is busy" line appears when something else on the node holds a port)
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if line.startswith("# ") and not line.startswith("# warning")]
    assert headers[:5] == [
        "# inference", "# trainer", "# orchestrator", "# envs/train/reverse-text",
        "# host 0 (127.0.0.1): inference, train env server 'reverse-text', trainer, orchestrator",
    ]  # fmt: skip
    assert headers[5].startswith("# cpus: ")  # the cores each compute process gets here
    assert [line.split(" (")[0] for line in headers[6:9]] == [
        "# secret to make: ENVRL_RELOAD_TOKEN", "# secret to make: ENVRL_INFERENCE_API_KEY",
        "# secret to make: CURVE keys of the env servers and the orchestrator in outputs/rl/curve",
    ]  # fmt: skip
    assert headers[-1].startswith("# commands")


def test_slurm_dry_run_prints_the_jobs_plan(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--slurm", "--dry-run", "--slurm.env-node", "1", "--placement.inference.replicas", "2"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "# host 0 (${HOST_0}): trainer, orchestrator\n" in out
    assert "# host 1 (${HOST_1}): inference-0, inference-1, train env server 'reverse-text'\n" in out
    assert 'address = "tcp://${HOST_1}:5000"' in out and 'host = "${HOST_0}"' in out


def dry_run_commands(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, *args, "--dry-run"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out.split("# commands")[1].splitlines()[1:]


def test_dry_run_prints_every_command_line_with_its_devices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
        lines = dry_run_commands(capsys, "--placement.trainer.gpus", "[1, 2]", "--placement.inference.gpus", "[0]")
    inference, server, trainer, note, orchestrator = lines
    assert inference.startswith("CUDA_VISIBLE_DEVICES=4 ") and "-m envrl.inference.main --config" in inference
    assert "-m envrl.serve.main --config" in server and "reverse-text.toml" in server
    assert trainer.startswith("CUDA_VISIBLE_DEVICES=5,6 ")
    assert (
        "-m envrl.launcher.torchrun --standalone --local-addr 127.0.0.1 --nproc-per-node 2 -m envrl.runtime.guarded envrl.trainer.main --config"
        in trainer
    )
    assert note.startswith("#   torchrun starts 2 ranks, each with its own RANK, LOCAL_RANK")
    assert "CUDA_VISIBLE_DEVICES" not in orchestrator and "-m envrl.orchestrator.main --config" in orchestrator


def test_one_trainer_rank_is_a_plain_process(capsys: pytest.CaptureFixture[str]) -> None:
    [trainer] = [line for line in dry_run_commands(capsys) if "trainer" in line]
    assert "torchrun" not in trainer and "-m envrl.trainer.main --config" in trainer


def test_an_impossible_placement_exits_2_naming_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--placement.trainer.gpus", "[0, 1]", "--placement.inference.gpus", "[1]"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "config error: placement.trainer.gpus [0, 1] and placement.inference.gpus [1] overlap on [1]" in err


def test_an_earlier_run_in_output_dir_needs_resume_or_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / MARKER).write_text("{}\n")  # rl made the dir
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "pass --resume to continue it or --clean to start over" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.name", "deps/models/nope"], "model.name 'deps/models/nope': no such directory"),
        (["--model.name", "scripts"], "model.name 'scripts': scripts has no config.json, so it is not an HF model"),
        (
            ["--orchestrator.envs", '[{"id": "reverse-txt"}]'],
            "orchestrator.envs[0].id 'reverse-txt': no installed environment has this id; did you mean 'reverse-text'?",
        ),
        (
            [
                "--orchestrator.envs",
                '[{"id": "reverse-text"}, {"id": "lernable", "train": false}]',
                "--orchestrator.eval.env",
                '[{"env": "lernable"}]',
            ],
            "orchestrator.envs[1].id 'lernable': no installed environment has this id; did you mean 'learnable'?",
        ),
        (
            ["--orchestrator.distill.teacher-weights", "outputs/no_teacher/weights/final"],
            "orchestrator.distill.teacher_weights 'outputs/no_teacher/weights/final': outputs/no_teacher/weights/final "
            "does not exist",
        ),
    ],
)
def test_a_missing_model_or_unknown_env_fails_the_dry_run_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: both passed --dry-run; the run failed after vLLM loaded, under a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, *args, "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_bare_rl_prints_usage_and_the_smoke_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rl --config FILE.toml") and "rl --config configs/debug/cpu_smoke.toml" in err


def test_rl_version_and_rl_envs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--version"])
    assert capsys.readouterr().out.startswith("envrl ")
    main(["envs"])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"learnable", "reverse-text", "verifiers:<id>"} <= set(listed)


def test_rl_help_all_fits_100_columns_and_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help-all"])
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100
    flags = [i for i, line in enumerate(lines) if line.startswith("  --")]
    undescribed = [lines[i] for i in flags if lines[i + 1].lstrip().startswith(("[default", "(required"))]
    assert len(flags) > 80 and not undescribed, undescribed
    assert "general:" in lines and "trainer:" in lines and "examples:" in lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--orchestrator.batch-size", "30", "--orchestrator.group-size", "8"],
            "in 'orchestrator' (from --orchestrator.group-size on the command line): batch_size (30) must be a multiple of group_size (8)",
        ),
        (
            ["--inference.vllm", '{"max_model_len": 512}', "--orchestrator.sampling.max-tokens", "600"],
            "orchestrator.sampling.max_tokens = 600 leaves no room for a prompt in inference.vllm.max_model_len = 512",
        ),
        (
            ["--orchestrator.seq-len", "9000", "--trainer.micro-batch-tokens", "4096"],
            "orchestrator.seq_len = 9000 is over trainer.micro_batch_tokens = 4096",
        ),
    ],
)
def test_keys_that_cannot_work_together_are_one_line_naming_both(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_ENV, *args, "--dry-run"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_gpus_on_a_machine_or_install_without_them_are_refused_before_the_run() -> None:
    def rl(*args: str) -> RLConfig:
        return resolve_config(RLConfig, overrides=[("orchestrator.envs", '[{"id": "reverse-text"}]'), *args])

    with pytest.raises(ConfigError, match="placement.trainer.gpus name GPUs, but this machine shows none"):
        _check_devices(rl(("placement.trainer.gpus", "[0]")), visible=None, cpu_vllm=False)
    with pytest.raises(ConfigError, match="the installed vLLM is the CPU build"):
        _check_devices(rl(("placement.inference.gpus", "[0]")), visible=["0"], cpu_vllm=True)
    _check_devices(rl(("placement.inference.gpus", "[0]")), visible=["0"], cpu_vllm=False)
    _check_devices(rl(), visible=None, cpu_vllm=True)


def test_an_env_arg_its_loader_does_not_take_is_one_line_naming_the_accepted_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: a TypeError under a traceback, from the env server, after vLLM loaded."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--orchestrator.envs", '[{"id": "reverse-text", "args": {"num_task": 3}}]', "--dry-run"])
    assert exit_info.value.code == 2
    assert (
        "orchestrator.envs[0].args: 'reverse-text' takes no argument 'num_task'; did you mean 'num_train'? "
        "it accepts: num_train, num_eval, seed, min_len, max_len"
    ) in capsys.readouterr().err


def test_dry_run_warns_of_a_busy_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit):
            main([*ONE_ENV, "--inference.port", str(port), "--dry-run"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"# warning: ports already in use: 127.0.0.1:{port} (inference)"), first
