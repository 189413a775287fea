"""The SLURM box's configuration (scripts/slurm_box/conf.py): names, addresses and slurm.conf."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.slurm_box.conf import CONTROLLER, MAX_NODES, Box, hosts_file, slurm_conf


def conf_keys(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith(("#", "NodeName"))]
    return {key: value for key, value in pairs}


def test_slurm_conf_needs_no_cgroup_or_accounting_and_keeps_its_state_under_the_box() -> None:
    box = Box(root=Path("/x/box"), nodes=2)
    text = slurm_conf(box, cpus=4)
    keys = conf_keys(text)
    assert keys["ProctrackType"] == "proctrack/linuxproc" and keys["TaskPlugin"] == "task/none"
    assert keys["AccountingStorageType"] == "accounting_storage/none"
    assert keys["JobAcctGatherType"] == "jobacct_gather/none"
    assert keys["AuthInfo"] == "socket=/x/box/munge/munge.socket"
    assert keys["SlurmctldHost"] == f"{CONTROLLER}({box.subnet}.2)"
    paths = [value for key, value in keys.items() if key.endswith(("Location", "Dir", "File"))]
    assert paths and all(path.startswith("/x/box/") for path in paths), paths
    nodes = [line for line in text.splitlines() if line.startswith("NodeName")]
    assert nodes == [f"NodeName=envrl-node{i} NodeAddr={box.subnet}.{10 + i} CPUs=4 State=UNKNOWN" for i in range(2)]


def test_every_host_has_its_own_address_namespace_and_a_link_name_linux_accepts() -> None:
    box = Box(nodes=MAX_NODES)
    assert len({box.address(h) for h in box.hosts}) == len({box.netns(h) for h in box.hosts}) == MAX_NODES + 1
    veths = {box.veth(h) for h in box.hosts}
    assert len(veths) == MAX_NODES + 1 and max(map(len, veths)) <= 15
    assert box.gateway not in {box.address(h) for h in box.hosts}


@pytest.mark.parametrize(("nodes", "subnet", "said"), [(0, "10.1.2", "--nodes 0"), (2, "10.1", "--subnet '10.1'"),
                                                       (2, "10.1.300", "--subnet")])  # fmt: skip
def test_a_box_that_cannot_be_says_which_option_is_wrong(nodes: int, subnet: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        Box(nodes=nodes, subnet=subnet)


def test_every_host_resolves_every_other_by_name() -> None:
    box = Box(nodes=2)
    names = {line.split()[1]: line.split()[0] for line in hosts_file(box).splitlines()}
    assert names == {"localhost": "127.0.0.1", "envrl-box": box.gateway} | {h: box.address(h) for h in box.hosts}
