"""`rl --slurm`: the batch script places each process on its host, from the run's resolved config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.envclient.curve import curve_keys, make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.plan.run import plan
from envrl.launcher.slurm import sbatch_script, write_sbatch

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
        '--nodelist="${HOST_1}"' in env_server and " --export=" in env_server and "ENVRL_RELOAD_TOKEN" not in env_server
    )
    [trainer] = [line for line in steps if "envrl.trainer.main" in line]
    assert '--nodelist="${HOST_0}"' in trainer and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in trainer
    assert "--nproc-per-node 8" in trainer
    assert steps.index(trainer) > steps.index(env_server)  # servers first
    assert '--nodelist="${HOST_0}"' in steps[-1] and "envrl.orchestrator.main" in steps[-1]
    assert f"-m envrl.launcher.log_rotation --logs-dir {tmp_path / 'run' / 'logs'} --max-mb 100 --keep 3 &" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_the_job_configs_point_every_process_at_the_hosts(tmp_path: Path) -> None:
    job = plan(two_nodes(tmp_path), ["gpu-a", "gpu-b"])
    configs = job.configs()
    replicas = [configs[f"inference-{i}"] for i in range(8)]
    assert {(c.host, c.port, c.reload.allow_remote) for c in replicas} == {("gpu-b", 8000 + i, True) for i in range(8)}
    orchestrator = configs["orchestrator"]
    assert orchestrator.inference.base_url == [f"http://gpu-b:{8000 + i}" for i in range(8)]
    [env] = orchestrator.envs
    server = configs["envs/train/reverse-text"]
    assert env.address == server.address == "tcp://gpu-b:5000"
    assert env.curve.server_public_key_file == job.curve_dir / "server.key"
    assert server.curve.client_keys_dir == job.curve_dir / "clients"
    assert server.client.base_urls == orchestrator.inference.base_url
    assert configs["trainer"].weights.host == "gpu-a"
    assert [command.name for command in job.on_host(0)] == ["trainer", "orchestrator"]


def test_trainer_ranks_on_several_hosts_meet_at_host_zero(tmp_path: Path) -> None:
    rl = two_nodes(
        tmp_path,
        ("slurm.trainer-nodes", "2"),
        ("placement.trainer.gpus", "[0,1,2,3]"),
        ("placement.inference.gpus", "[4,5,6,7]"),
        ("placement.inference.replicas", "4"),
    )
    trainers = [c for _, c in plan(rl, ["gpu-a", "gpu-b"]).start_order() if c.name.startswith("trainer")]
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


FAKE_SRUN = r"""#!/bin/bash
# SLURM's srun, as far as these tests need: it records the words it got and the environment the
# step would get (--export=NAME,...: those names plus SLURM_*; no --export: all), and runs nothing.
step=$(mktemp -p "$SRUN_LOG" step.XXXXXX)
printf '%s\0' "$@" > "$step.argv"
exported=ALL
while [[ $1 == --* ]]; do case $1 in --export=*) exported=${1#--export=};; esac; shift; done
if [[ $exported == ALL ]]; then env -0 > "$step.env"; else
  IFS=, read -ra names <<< "$exported"
  for name in $(compgen -e); do
    [[ $name == SLURM_* || ,$exported, == *,$name,* ]] && printf '%s=%s\0' "$name" "${!name}"
  done > "$step.env"
fi
"""


def run_job_steps(tmp_path: Path, rl: RLConfig, environ: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """Run the job script of `rl` up to its wait loop with a stand-in srun (SLURM is not on this
    box): each step's srun words and the environment the step would start with."""
    script = write_sbatch(rl).read_text().split("# the run ends when")[0]
    # the job's log rotation runs until the job ends: stopped here, once it has started
    script += 'for pid in "${!NAME[@]}"; do [[ ${NAME[$pid]} == log-rotation ]] && kill $pid && wait $pid; done; wait\n'
    bin_dir, log = tmp_path / "bin", tmp_path / "srun"
    bin_dir.mkdir()
    log.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-a\\ngpu-b\\n'\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_NODELIST": "gpu-[a-b]"}
    base["SRUN_LOG"] = str(log)
    subprocess.run(["bash", "-c", script], env={**base, **environ}, check=True, capture_output=True, text=True)
    steps = []
    for argv in sorted(log.glob("*.argv")):
        words = argv.read_bytes().decode().split("\0")[:-1]
        env = argv.with_suffix(".env").read_bytes().decode().split("\0")[:-1]
        steps.append((words, dict(pair.split("=", 1) for pair in env)))
    return steps


def test_no_secret_is_a_word_of_any_job_step_and_env_servers_get_only_the_allow_list(tmp_path: Path) -> None:
    rl = two_nodes(tmp_path)
    rl.orchestrator.envs[0].pass_env = ["MY_JUDGE_KEY"]
    environ = {"MY_JUDGE_KEY": "judge-secret", "WANDB_API_KEY": "wandb-secret", "LC_TIME": "C"}
    steps = run_job_steps(tmp_path, rl, environ)
    assert len(steps) == 8 + 1 + 1 + 1  # inference replicas, env server, trainer, orchestrator
    [(_, orchestrator)] = [(argv, env) for argv, env in steps if "envrl.orchestrator.main" in argv]
    token, key = orchestrator["ENVRL_RELOAD_TOKEN"], orchestrator["ENVRL_INFERENCE_API_KEY"]
    assert len(token) >= 32 and len(key) >= 32 and token != key  # generated by the job, one each
    secrets = ["judge-secret", "wandb-secret", token, key]
    for argv, _ in steps:  # what any user of the host reads in /proc/<srun's pid>/cmdline
        assert not [secret for secret in secrets if any(secret in word for word in argv)], argv
    [(_, server)] = [(argv, env) for argv, env in steps if "envrl.serve.main" in argv]
    assert server["MY_JUDGE_KEY"] == "judge-secret" and server["ENVRL_INFERENCE_API_KEY"] == key
    assert server["LC_TIME"] == "C" and server["HOME"] == str(tmp_path)  # by prefix; from the allow-list
    assert "ENVRL_RELOAD_TOKEN" not in server and "WANDB_API_KEY" not in server
    for argv, env in steps:
        if "envrl.inference.main" in argv:
            assert env["ENVRL_INFERENCE_API_KEY"] == key and env["ENVRL_RELOAD_TOKEN"] == token
