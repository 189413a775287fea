"""The box is a cluster: srun places one task per node, each in its own network stack and host
name, the hosts reach one another through their addresses and nothing outside the subnet."""

from __future__ import annotations

import subprocess

from scripts.slurm_box.box import environ
from scripts.slurm_box.conf import Box


def test_srun_runs_on_every_node_under_its_own_name_and_address(cluster: Box) -> None:
    script = "echo $(hostname) $(hostname -I) $SLURMD_NODENAME; ip -4 route"
    done = subprocess.run(
        ["srun", f"--nodes={cluster.nodes}", "--ntasks-per-node=1", "--label", "bash", "-c", script],
        env=environ(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    seen = [line.split(": ", 1)[1].split() for line in lines if line.split(": ", 1)[1].startswith("envrl-")]
    assert seen == [[name, cluster.address(name), name] for name in cluster.names], done.stdout
    routes = [line.split(": ", 1)[1] for line in lines if "dev eth0" in line]
    assert routes == [f"{cluster.subnet}.0/24 dev eth0 proto kernel scope link src {cluster.address(name)} "
                      for name in cluster.names], f"a node has a route out of the box:\n{done.stdout}"  # fmt: skip
