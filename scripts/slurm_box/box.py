"""`up`, `down` and `status` of the box: after `down` no process, namespace, link or directory of
the box is left; `up` on a running box of the same size changes nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from scripts.slurm_box.conf import BRIDGE, CONTROLLER, MARKER, PREFIX, Box, hosts_file, slurm_conf

NEEDED = ("ip", "nsenter", "unshare", "hostname", "munged", "slurmctld", "slurmd", "sinfo", "scontrol")
READY_TIMEOUT_S = 60.0


class BoxError(RuntimeError):
    """Why the box cannot be brought up or down here, in one line."""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; a failure raises with its stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BoxError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def environ(box: Box) -> dict[str, str]:
    """The environment for SLURM's commands against the box."""
    return {**os.environ, "SLURM_CONF": str(box.conf)}


def check_machine() -> None:
    """Raise, saying exactly why in one line, where this machine cannot run a box."""
    if os.geteuid() != 0:
        raise BoxError("slurm_box must run as root (it makes network namespaces and runs slurmd as root)")
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        raise BoxError(f"missing {', '.join(missing)}: install them with `apt-get install -y slurm-wlm munge iproute2`")
    probe = f"{PREFIX}-probe"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise BoxError(f"no network namespaces here (`ip netns add` said: {made.stderr.strip()})")
    run("ip", "netns", "del", probe)


def namespaces() -> list[str]:
    """The box's network namespaces that exist now."""
    listed = run("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(PREFIX + "-")]


def links() -> list[str]:
    """The box's links in this namespace (the bridge and the veths' box-side ends)."""
    listed = run("ip", "-o", "link", "show", check=False).stdout.split("\n")
    names = [line.split(":")[1].strip().split("@")[0] for line in listed if line.count(":") >= 2]
    return [name for name in names if name.startswith(PREFIX)]


def alive(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process runs."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def is_up(box: Box) -> bool:
    """Every daemon of a box of `box.nodes` nodes runs."""
    daemons = ["munged", "slurmctld", *(f"slurmd-{name}" for name in box.names)]
    return (
        (box.root / MARKER).exists()
        and all(alive(box.pid_file(d)) for d in daemons)
        and not (alive(box.pid_file(f"slurmd-envrl-node{box.nodes}")))
    )


def make_network(box: Box) -> None:
    """The bridge (the box is its .1) and one namespace per host, each with a veth on the bridge,
    its address and loopback up, and no route out of the subnet."""
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{box.gateway}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    for host in box.hosts:
        ns, veth = box.netns(host), box.veth(host)
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth, "master", BRIDGE, "up")
        run("ip", "-n", ns, "addr", "add", f"{box.address(host)}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")


def in_host(box: Box, host: str, *argv: str) -> list[str]:
    """`argv` run in `host`'s network namespace, a UTS namespace of its own named `host`, and a
    mount namespace of its own where /etc/hosts names every host of the box (nsenter, not `ip
    netns exec`, which remounts /sys)."""
    script = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    enter = ["nsenter", f"--net=/run/netns/{box.netns(host)}", "unshare", "--uts", "--mount", "--propagation=private"]
    return [*enter, "sh", "-c", script, host, str(box.hosts_file), *argv]


def start_daemons(box: Box) -> None:
    key = box.munge_socket.parent / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    run("munged", "--force", f"--key-file={key}", f"--socket={box.munge_socket}",
        f"--pid-file={box.pid_file('munged')}", f"--log-file={box.log_file('munged')}",
        f"--seed-file={box.munge_socket.parent / 'munged.seed'}")  # fmt: skip
    env = environ(box)
    subprocess.run(in_host(box, CONTROLLER, "slurmctld", "-c", "-f", str(box.conf)), env=env, check=True)
    for name in box.names:
        subprocess.run(in_host(box, name, "slurmd", "-f", str(box.conf), "-N", name), env=env, check=True)


def wait_idle(box: Box) -> None:
    """Until every node is idle; raise naming the logs if they are not within `READY_TIMEOUT_S`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=environ(box), capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        if sorted(states) == sorted(box.names) and all(s.rstrip("*") == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    raise BoxError(f"nodes not idle after {READY_TIMEOUT_S:g} s ({states or 'no answer'}): see {box.root / 'logs'}")


def up(box: Box) -> None:
    """Bring the box up (nothing changes if it runs with this many nodes)."""
    check_machine()
    if is_up(box):
        return
    if (box.root / MARKER).exists() and alive(box.pid_file("slurmctld")):
        raise BoxError(f"a box of another size runs at {box.root}: `python -m scripts.slurm_box down` first")
    down(box)  # whatever a failed `up` left
    if box.root.exists():
        raise BoxError(f"{box.root} exists and the box did not make it: remove it or pick another --dir")
    box.root.parent.mkdir(parents=True, exist_ok=True)
    box.root.mkdir(mode=0o700)  # fails if another process made it since the check above: never theirs
    for sub in ("munge", "run", "logs", "ctld", "spool"):
        (box.root / sub).mkdir(mode=0o755)
    box.root.chmod(0o755)
    (box.root / MARKER).write_text("made by python -m scripts.slurm_box up; `down` removes this directory\n")
    box.conf.write_text(slurm_conf(box, os.cpu_count() or 1))
    box.hosts_file.write_text(hosts_file(box))
    try:
        make_network(box)
        start_daemons(box)
        wait_idle(box)
    except (BoxError, subprocess.CalledProcessError):
        logs = box.root / "logs"
        tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
        down(box)
        raise BoxError(f"the box did not come up; its daemons' logs:{tails}") from None


def kill_all(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL what is left after a few seconds."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not zombie(pid)]
            time.sleep(0.1)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def down(box: Box) -> None:
    """Stop every process in the box's namespaces, then munged; remove the namespaces, the links
    and the box's directory (only one the box made)."""
    spaces = namespaces()
    pids = [int(p) for ns in spaces for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]
    munged = alive(box.pid_file("munged"))
    kill_all(pids)
    if munged is not None:
        kill_all([munged])
    for ns in spaces:
        run("ip", "netns", "del", ns)
    for link in links():
        run("ip", "link", "del", link, check=False)  # a veth's end goes with its namespace
    if (box.root / MARKER).exists():
        shutil.rmtree(box.root)


def status(box: Box) -> str:
    """What runs: the nodes and their states, or why the box is down."""
    if not (box.root / MARKER).exists():
        return f"down (no box at {box.root})"
    out = subprocess.run(["sinfo", "-N", "-o", "%N %T %o"], env=environ(box), capture_output=True, text=True)
    return out.stdout.strip() or f"not answering: {out.stderr.strip()} (logs: {box.root / 'logs'})"
