"""The box's names, addresses and `slurm.conf`: pure functions of its directory and node count."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREFIX = "envrl-box"
"""Every network namespace and link the box makes starts with it: `down` removes exactly those."""
BRIDGE = "envrl-box-br"
CONTROLLER = "envrl-ctl"
DEFAULT_ROOT = Path("/tmp/envrl-slurm-box")
DEFAULT_SUBNET = "10.213.47"
"""The first three octets of the box's /24: the box itself (the login node) is .1, the controller
.2, node i is .(10 + i)."""
MAX_NODES = 200
MARKER = ".envrl-slurm-box"
"""The file that says the box made its directory (`down` deletes no other)."""


@dataclass(frozen=True)
class Box:
    """One box: its state directory, its nodes and its subnet."""

    root: Path = DEFAULT_ROOT
    nodes: int = 3
    subnet: str = DEFAULT_SUBNET

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.nodes}: a box has 1 to {MAX_NODES} nodes")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
            raise ValueError(f"--subnet {self.subnet!r}: give the first three octets of a /24, e.g. {DEFAULT_SUBNET}")

    @property
    def names(self) -> list[str]:
        """The nodes' host names (SLURM's node names), in node order."""
        return [f"envrl-node{i}" for i in range(self.nodes)]

    @property
    def hosts(self) -> list[str]:
        """Controller first, then the nodes: every namespace's host name."""
        return [CONTROLLER, *self.names]

    def netns(self, host: str) -> str:
        """The network namespace of `host` (`ip netns` name)."""
        return f"{PREFIX}-{host.removeprefix('envrl-')}"

    def veth(self, host: str) -> str:
        """The box-side end of `host`'s veth pair (15 characters at most, a Linux link name's limit)."""
        return f"{PREFIX}-{host.removeprefix('envrl-').replace('node', 'n')}"[:15]

    @property
    def gateway(self) -> str:
        """The box's own address on the bridge: where `sbatch` and `srun` run from."""
        return f"{self.subnet}.1"

    def address(self, host: str) -> str:
        """`host`'s address on the bridge."""
        if host == CONTROLLER:
            return f"{self.subnet}.2"
        return f"{self.subnet}.{10 + self.names.index(host)}"

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def hosts_file(self) -> Path:
        """The /etc/hosts every host of the box sees (its own mount namespace binds it there)."""
        return self.root / "hosts"

    def pid_file(self, daemon: str) -> Path:
        """The pid file of `munged`, `slurmctld` or a node's `slurmd` (`slurmd-envrl-node0`)."""
        return self.root / "run" / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.root / "logs" / f"{daemon}.log"


def slurm_conf(box: Box, cpus: int) -> str:
    """The cluster's `slurm.conf`: no cgroup, no accounting, munge on the box's own socket, each
    node addressed on the bridge, every node `cpus` CPUs as configured (not as detected)."""
    r = box.root
    lines = [
        "# Written by `python -m scripts.slurm_box up`; removed by `down`.",
        "ClusterName=envrl-box",
        f"SlurmctldHost={CONTROLLER}({box.address(CONTROLLER)})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={box.munge_socket}",
        f"StateSaveLocation={r}/ctld",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={box.pid_file('slurmctld')}",
        f"SlurmdPidFile={r}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={box.log_file('slurmctld')}",
        f"SlurmdLogFile={r}/logs/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "KillWait=10",
        *[f"NodeName={name} NodeAddr={box.address(name)} CPUs={cpus} State=UNKNOWN" for name in box.names],
        "PartitionName=envrl Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        "",
    ]
    return "\n".join(lines)


def hosts_file(box: Box) -> str:
    """/etc/hosts of the box's hosts: loopback, the box itself, and every host by name, as a
    cluster's DNS names its nodes."""
    lines = ["127.0.0.1 localhost", f"{box.gateway} envrl-box", *(f"{box.address(h)} {h}" for h in box.hosts)]
    return "\n".join(lines) + "\n"
