"""`rl --slurm`: the batch script places each process on its host, from the run's resolved config."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from envrl.config import ConfigError, resolve_config
from envrl.data import host_recoveries
from envrl.envclient.curve import curve_keys, make_curve_keys
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.plan.run import plan
from envrl.launcher.slurm import (
    SIGNAL_MARGIN_S,
    JobSignal,
    host_grace_s,
    job_signal,
    sbatch_script,
    write_sbatch,
)
from envrl.launcher.slurm import main as slurm_step

ROOT = Path(__file__).resolve().parents[3]
TWO_NODES = ROOT / "configs" / "gpu" / "two_nodes.toml"
TINY_MODEL = ROOT / "deps" / "models" / "tiny-chat"


def two_nodes(tmp_path: Path, *overrides: tuple[str, str]) -> RLConfig:
    base = [("model.name", str(TINY_MODEL)), ("output-dir", str(tmp_path / "run")), *overrides]
    return resolve_config(RLConfig, [TWO_NODES], overrides=base)


def test_the_sbatch_script_runs_each_hosts_slice_under_its_supervisor(tmp_path: Path) -> None:
    script = sbatch_script(two_nodes(tmp_path), tmp_path / "rl.toml")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n" in script
    assert "#SBATCH --exclusive\n" in script
    hosts = '--hosts "${ADDR_0},${ADDR_1}"'
    assert f"-m envrl.launcher.slurm --config {tmp_path / 'rl.toml'} {hosts}" in script
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    for i, step in enumerate(steps):
        assert f'--nodelist="${{HOST_{i}}}"' in step and step.endswith(
            f"-m envrl.launcher.host --config {tmp_path / 'rl.toml'} {hosts} --grace-s 110 --host {i} &"
        )  # two_nodes.toml's --signal=TERM@120, less the supervisor's own margin
    assert len(steps) == 2
    assert "# host 0: trainer, orchestrator\n" in script
    assert (
        "# host 1: " + ", ".join([*(f"inference-{i}" for i in range(8)), "train env server 'reverse-text'"]) in script
    )
    assert f"-m envrl.launcher.log_rotation --logs-dir {tmp_path / 'run' / 'logs'} --max-mb 100 --keep 3 &" in script
    assert "its supervisor stops what it started within 110 s (--grace-s)\n" in script
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
# step gets (all of the job's: srun's default --export=ALL), and runs nothing.
step=$(mktemp -p "$SRUN_LOG" step.XXXXXX)
printf '%s\0' "$@" > "$step.argv"
env -0 > "$step.env"
"""
FAKE_SCONTROL = r"""#!/bin/bash
# `scontrol show hostnames`, `scontrol show node NAME -o` of a job on gpu-a and gpu-b
case $2 in hostnames) printf 'gpu-a\ngpu-b\n';; node) echo "NodeName=$3 Arch=x86_64 NodeAddr=addr-$3 NodeHostName=$3";; esac
"""


def stand_ins(tmp_path: Path, tools: dict[str, str]) -> tuple[dict[str, str], Path]:
    """SLURM's `tools` (name: script) on the PATH of a job's environment, with `scontrol`'s: that
    environment and the directory where they record what they got (`SRUN_LOG`)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "srun"
    bin_dir.mkdir()
    log.mkdir()
    for tool, text in {**tools, "scontrol": FAKE_SCONTROL}.items():
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(0o755)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_NODELIST": "gpu-[a-b]"}
    return {**base, "SLURM_JOB_ID": "42", "SRUN_LOG": str(log)}, log


def run_job_steps(tmp_path: Path, rl: RLConfig, environ: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """Run the job script of `rl` up to its wait loop with a stand-in srun and scontrol: each
    step's srun words and the environment the step starts with."""
    script = write_sbatch(rl).read_text().split("# the run ends when")[0]
    # the job's log rotation runs until the job ends: stopped here, once it has started
    script += 'for pid in "${!NAME[@]}"; do [[ ${NAME[$pid]} == log-rotation ]] && kill $pid && wait $pid; done; wait\n'
    base, log = stand_ins(tmp_path, {"srun": FAKE_SRUN})
    subprocess.run(["bash", "-c", script], env={**base, **environ}, check=True, capture_output=True, text=True)
    steps = []
    for argv in sorted(log.glob("*.argv")):
        words = argv.read_bytes().decode().split("\0")[:-1]
        env = argv.with_suffix(".env").read_bytes().decode().split("\0")[:-1]
        steps.append((words, dict(pair.split("=", 1) for pair in env)))
    return steps


def test_no_secret_is_a_word_of_any_job_step_and_each_host_gets_the_jobs_secrets_and_addresses(tmp_path: Path) -> None:
    rl = two_nodes(tmp_path)
    environ = {"WANDB_API_KEY": "wandb-secret"}
    steps = sorted(run_job_steps(tmp_path, rl, environ), key=lambda step: step[0][-1])
    assert [argv[-1] for argv, _ in steps] == ["0", "1"]  # one step per host
    for argv, _ in steps:
        assert argv[argv.index("--hosts") + 1] == "addr-gpu-a,addr-gpu-b"  # NodeAddr, not the node's name
    token, key = steps[0][1]["ENVRL_RELOAD_TOKEN"], steps[0][1]["ENVRL_INFERENCE_API_KEY"]
    assert len(token) >= 32 and len(key) >= 32 and token != key  # generated by the job, one each
    assert all((env["ENVRL_RELOAD_TOKEN"], env["ENVRL_INFERENCE_API_KEY"]) == (token, key) for _, env in steps)
    for argv, _ in steps:  # what any user of the host reads in /proc/<srun's pid>/cmdline
        assert not [secret for secret in ("wandb-secret", token, key) if any(secret in word for word in argv)], argv


@pytest.mark.parametrize(
    ("option", "lead_s", "batch_only"),
    [
        ("--signal=TERM@120", 120, False),
        ("--signal=B:TERM@120", 120, True),
        ("--signal=15@120", 120, False),
        ("--signal=SIGTERM@120", 120, False),
        ("--signal=RB:term@300", 300, True),
        ("--signal TERM@120", 120, False),
        ("--signal=TERM", 60, False),  # sbatch's own lead
    ],
)
def test_the_jobs_signal_lead_is_read_in_every_form_sbatch_takes(option: str, lead_s: int, batch_only: bool) -> None:
    assert job_signal(["--exclusive", option]) == JobSignal(option, lead_s, batch_only)


def test_each_hosts_grace_is_the_signal_lead_less_a_margin_and_never_less_than_rls_own() -> None:
    assert host_grace_s(job_signal(["--signal=TERM@120"])) == 120 - SIGNAL_MARGIN_S
    assert host_grace_s(job_signal(["--signal=TERM@20"])) == RLConfig.shutdown_grace_s
    assert host_grace_s(job_signal(["--time=02:00:00"])) == RLConfig.shutdown_grace_s  # no --signal


def test_without_signal_the_host_steps_get_rls_own_grace(tmp_path: Path) -> None:
    script = sbatch_script(two_nodes(tmp_path, ("slurm.sbatch", '["--exclusive"]')), tmp_path / "rl.toml")
    grace = f"{RLConfig.shutdown_grace_s:g}"
    assert all(f"--grace-s {grace} --host" in line for line in script.splitlines() if line.startswith("srun "))
    assert f"# no --signal in slurm.sbatch: each host's supervisor gives its processes {grace} s" in script
    assert "trap " not in script


@pytest.mark.parametrize("option", ["--signal=USR1@60", "--signal=B:10@60", "--signal=TERM@soon"])
def test_a_signal_that_is_not_sigterm_is_refused_naming_the_key(tmp_path: Path, option: str) -> None:
    with pytest.raises(ConfigError, match=rf"slurm.sbatch: '{option}' sends no SIGTERM.*--signal=TERM@<seconds>"):
        sbatch_script(two_nodes(tmp_path, ("slurm.sbatch", json.dumps([option]))), tmp_path / "rl.toml")


STEP_UNTIL_SIGTERM = r"""#!/bin/bash
# srun running a host step that serves until SIGTERM, then exits 143 as the host's supervisor does
trap 'exit 143' TERM
echo $$ > "$SRUN_LOG/$$.tmp" && mv "$SRUN_LOG/$$.tmp" "$SRUN_LOG/$$.pid"
while :; do sleep 0.05; done
"""
FAKE_SCANCEL = r"""#!/bin/bash
# `scancel --signal=TERM JOB`: the signal to every step of the job, not to its batch shell
echo "$*" >> "$SRUN_LOG/scancel"
for step in "$SRUN_LOG"/*.pid; do kill -TERM "$(cat "$step")" 2>/dev/null; done
"""


def test_with_signal_b_the_batch_shell_forwards_sigterm_to_every_host_step(tmp_path: Path) -> None:
    script = write_sbatch(two_nodes(tmp_path, ("slurm.sbatch", '["--signal=B:TERM@120"]')))
    environ, log = stand_ins(tmp_path, {"srun": STEP_UNTIL_SIGTERM, "scancel": FAKE_SCANCEL})
    job = subprocess.Popen(["bash", str(script)], env=environ, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(log.glob("*.pid"))) < 2:  # both host steps run
            assert job.poll() is None and time.monotonic() < deadline, "the job's host steps did not start"
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)  # what sbatch's B: sends 120 s before the time limit
        _, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
        for step in log.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(step.read_text()), signal.SIGKILL)
    assert "envrl: SIGTERM (--signal): forwarded to every host step" in stderr
    assert (log / "scancel").read_text().splitlines()[0] == "--signal=TERM 42"
    assert "was stopped by SIGTERM (scancel, or --signal before the time limit): stopping the job" in stderr
    assert job.returncode == 1  # the job did not complete


def test_the_jobs_first_step_clears_an_earlier_jobs_restarts(tmp_path: Path) -> None:
    rl = two_nodes(tmp_path)
    stored = write_sbatch(rl).parent / "rl.toml"
    host_recoveries.write(rl.output_dir, 1, {"inference-0": {"restarts": 1, "seconds_lost": 2.0, "faults": []}})
    slurm_step(["--config", str(stored), "--hosts", "gpu-a,gpu-b"])
    assert host_recoveries.gather(rl.output_dir, 0, {}) == {}
