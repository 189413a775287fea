"""`rl --slurm`: the batch script places each process on its host, from the run's resolved config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.slurm import curve_keys, make_curve_keys, plan_job, sbatch_script

ROOT = Path(__file__).resolve().parents[3]
TWO_NODES = ROOT / "configs" / "gpu" / "two_nodes.toml"
TINY_MODEL = ROOT / "deps" / "models" / "tiny-chat"


def two_nodes(tmp_path: Path, *overrides: tuple[str, str]) -> RLConfig:
    base = [("model.name", str(TINY_MODEL)), ("output-dir", str(tmp_path / "run")), *overrides]
    return resolve_config(RLConfig, [TWO_NODES], overrides=base)


def test_the_sbatch_script_starts_each_process_on_its_host(tmp_path: Path) -> None:
    script = sbatch_script(two_nodes(tmp_path), tmp_path / "rl.toml")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n" in script
    assert "#SBATCH --exclusive\n" in script
    assert f'-m envrl.launcher.slurm --config {tmp_path / "rl.toml"} --hosts "${{HOST_0}},${{HOST_1}}"' in script
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    inference = [line for line in steps if "envrl.inference.main" in line]
    assert [line.split(" env ")[1].split()[0] for line in inference] == [f"CUDA_VISIBLE_DEVICES={i}" for i in range(8)]
    assert all('--nodelist="${HOST_1}"' in line for line in inference)
    [env_server] = [line for line in steps if "envrl.serve.main" in line]
    assert (
        '--nodelist="${HOST_1}"' in env_server and " env -i " in env_server and "ENVRL_RELOAD_TOKEN" not in env_server
    )
    [trainer] = [line for line in steps if "envrl.trainer.main" in line]
    assert '--nodelist="${HOST_0}"' in trainer and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in trainer
    assert "--nproc-per-node 8" in trainer
    assert steps.index(trainer) > steps.index(env_server)  # servers first
    assert '--nodelist="${HOST_0}"' in steps[-1] and "envrl.orchestrator.main" in steps[-1]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_the_job_configs_point_every_process_at_the_hosts(tmp_path: Path) -> None:
    plan = plan_job(two_nodes(tmp_path), ["gpu-a", "gpu-b"])
    replicas = [plan.configs[f"inference-{i}"] for i in range(8)]
    assert {(c.host, c.port, c.reload.allow_remote) for c in replicas} == {("gpu-b", 8000 + i, True) for i in range(8)}
    orchestrator = plan.configs["orchestrator"]
    assert orchestrator.inference.base_url == [f"http://gpu-b:{8000 + i}" for i in range(8)]
    [env] = orchestrator.envs
    server = plan.configs["envs/train/reverse-text"]
    assert env.address == server.address == "tcp://gpu-b:5000"
    assert env.curve.server_public_key_file == plan.curve_dir / "server.key"
    assert server.curve.client_keys_dir == plan.curve_dir / "clients"
    assert server.model_access.base_urls == orchestrator.inference.base_url
    assert plan.configs["trainer"].weights.host == "gpu-a"
    assert [command.name for command in plan.hosts[0].commands] == ["trainer", "orchestrator"]


def test_trainer_ranks_on_several_hosts_meet_at_host_zero(tmp_path: Path) -> None:
    rl = two_nodes(
        tmp_path,
        ("slurm.trainer-nodes", "2"),
        ("trainer.gpus", "[0,1,2,3]"),
        ("inference.gpus", "[4,5,6,7]"),
        ("inference.replicas", "4"),
    )
    plan = plan_job(rl, ["gpu-a", "gpu-b"])
    trainers = [c for host in plan.hosts for c in host.commands if c.name.startswith("trainer")]
    assert [c.name for c in trainers] == ["trainer", "trainer-node1"]
    for rank, command in enumerate(trainers):
        argv = " ".join(command.argv)
        assert f"--nnodes 2 --node-rank {rank} --master-addr gpu-a --master-port 29500 --nproc-per-node 4" in argv


def test_rl_slurm_prints_the_script_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(
        ["--config", str(TWO_NODES), "--model.name", str(TINY_MODEL), "--output-dir", str(tmp_path / "run"), "--slurm"]
    )
    script = Path(capsys.readouterr().out.strip())
    assert script == tmp_path / "run" / "slurm" / "job.sbatch"
    assert script.read_text().startswith("#!/bin/bash\n")
    stored = resolve_config(RLConfig, [script.parent / "rl.toml"])
    assert stored.slurm.nodes == 2 and stored.model.name == str(TINY_MODEL)


def test_the_jobs_curve_secrets_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    curve_dir = tmp_path / "slurm" / "curve"
    make_curve_keys(curve_dir)
    server, client = curve_keys(curve_dir)
    for directory in (curve_dir, curve_dir / "clients"):
        assert directory.stat().st_mode & 0o077 == 0, oct(directory.stat().st_mode)
    for secret in (server.secret_key_file, client.secret_key_file):
        assert secret.stat().st_mode & 0o077 == 0, oct(secret.stat().st_mode)


def test_an_env_server_step_sees_only_the_allow_list_of_the_jobs_environment(tmp_path: Path) -> None:
    rl = two_nodes(tmp_path)
    rl.orchestrator.envs[0].pass_env = ["MY_JUDGE_KEY"]
    script = sbatch_script(rl, tmp_path / "rl.toml")
    prefixed = [line for line in script.splitlines() if "ENVRL_PREFIXED_ENV" in line and not line.startswith("srun")]
    [env_server] = [line for line in script.splitlines() if line.startswith("srun ") and "envrl.serve.main" in line]
    # SLURM is not on this box: a stand-in `srun` runs the step's command (its words after the
    # options) here, and the env server's interpreter is swapped for `env`, which prints what it got.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    step = env_server.split(f" {sys.executable} ")[0] + " /usr/bin/env"
    job = "\n".join(["set -uo pipefail", "HOST_1=gpu-b", *prefixed, step])
    environ = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LC_TIME": "C",
        "MY_JUDGE_KEY": "passed",
        "ENVRL_RELOAD_TOKEN": "secret-token",
        "WANDB_API_KEY": "secret-wandb",
    }
    out = subprocess.run(["bash", "-c", job], env=environ, capture_output=True, text=True, check=True).stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert seen["LC_TIME"] == "C" and seen["MY_JUDGE_KEY"] == "passed" and seen["HOME"] == str(tmp_path)
    assert "ENVRL_RELOAD_TOKEN" not in seen and "WANDB_API_KEY" not in seen
