"""Bubblewrap's command line and the image checks: nothing is writable but two fresh tmpfs of `limits.disk_mib`
(workdir, also `/tmp`, and `/dev/shm`); bubblewrap's own root and `/dev` are read-only."""

from __future__ import annotations

import shutil
import stat
from functools import cache, lru_cache
from pathlib import Path

from loguru import logger

from envrl.sandbox import reaper, uids
from envrl.sandbox.base import SandboxConfig
from envrl.sandbox.bridge import MOUNT
from envrl.sandbox.errors import SandboxStartError
from envrl.sandbox.limits import Limits

SANDBOX_UID = 65534
"""The user id (nobody) code sees inside the sandbox."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
"""PATH inside a sandbox."""
_AGENT = (Path(__file__).parent / "agent.py").read_text()


def bwrap_path() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxStartError("bubblewrap is not installed (`bwrap` not on PATH): apt-get install -y bubblewrap")
    return found


@lru_cache(maxsize=64)
def check_readable(path: Path) -> None:
    """`SandboxStartError` unless an unprivileged user can reach and read `path` (the sandbox's
    host user is one: an image under a 0700 home cannot be mounted)."""
    if not path.exists():
        raise SandboxStartError(f"sandbox image path {path} does not exist (sandbox.image / sandbox.python)")
    resolved = path.resolve()
    for parent in reversed(resolved.parents):
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise SandboxStartError(
                f"sandbox image path {path} is not reachable by an unprivileged user: {parent} has mode "
                f"{stat.S_IMODE(parent.stat().st_mode):o} (no o+x). Use an image outside it (e.g. the system "
                "python /usr/bin/python3, or a uv python installed with UV_PYTHON_INSTALL_DIR=/opt/uv-python)"
            )
    if not resolved.stat().st_mode & stat.S_IROTH:
        raise SandboxStartError(f"sandbox image path {path} is not readable by others (mode o+r needed)")


def check_image(config: SandboxConfig) -> None:
    """`SandboxStartError` unless the image and its interpreter can be mounted as they are."""
    python = config.python
    for path in [python, *config.image]:
        check_readable(path)
    for path in config.image:
        if path.is_relative_to("/tmp") or path.is_relative_to(config.workdir):
            raise SandboxStartError(
                f"sandbox.image path {path} is under /tmp or {config.workdir}: those are the sandbox's own"
            )
    if not any(python.resolve().is_relative_to(p.resolve()) or python.is_relative_to(p) for p in config.image):
        raise SandboxStartError(f"sandbox.python {python} is not inside any sandbox.image path {config.image}")


def bwrap_argv(
    config: SandboxConfig, uid: int, bridge: Path | None, *, agent_fds: tuple[int, int], seccomp_fd: int
) -> list[str]:
    """The full command line: `uids.IF_FREE` (the exec after `setpriv` fails if the uid has a
    process), `setpriv` to the sandbox's host uid, `prlimit` with the limits, then
    bubblewrap (with the host `bridge` directory read-only at `bridge.MOUNT`, the seccomp program
    read from `seccomp_fd`), then the agent on its protocol pipes `agent_fds` (requests, answers)."""
    check_image(config)
    argv = [*uids.IF_FREE, *reaper.as_uid(uid), *config.limits.prlimit_argv(), bwrap_path(), "--unshare-all"]
    argv += ["--unshare-user"]
    argv += ["--disable-userns", "--seccomp", str(seccomp_fd)]
    argv += ["--share-net"] if config.network else []
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    for path in config.image:
        argv += ["--ro-bind", str(path), str(path)]
    if Path("/usr") in config.image:
        for name in ("bin", "lib", "lib64", "sbin"):
            if Path(f"/usr/{name}").is_dir():
                argv += ["--symlink", f"usr/{name}", f"/{name}"]
    argv += ["--ro-bind", str(bridge), MOUNT] if bridge is not None else []
    work = config.workdir
    disk = str(config.limits.disk_mib << 20)  # /dev/shm: a second tmpfs of that size; /dev itself read-only
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", disk, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--size", disk, "--tmpfs", work]
    argv += ["--symlink", work, "/tmp"] if work != "/tmp" else []
    argv += ["--remount-ro", "/"]  # bubblewrap's root is a tmpfs too, of no size: nothing may be written there
    argv += ["--chdir", work, "--setenv", "HOME", work, "--setenv", "TMPDIR", work, "--setenv", "LANG", "C.UTF-8"]
    argv += ["--setenv", "PATH", SANDBOX_PATH, "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    return [*argv, "--", str(config.python), "-I", "-S", "-c", _AGENT, *map(str, agent_fds)]


def say_memory_bound(limits: Limits) -> None:
    """Say once per process and limits what bounds a sandbox's memory, and that no cgroup does."""
    _say_once(limits.nproc, limits.memory_mib, limits.disk_mib)


@cache
def _say_once(nproc: int, memory_mib: int, disk_mib: int) -> None:
    logger.info(
        f"sandbox memory: no memory cgroup per sandbox (envrl makes none yet); each holds at most "
        f"{nproc} processes x {memory_mib} MiB (limits.nproc x limits.memory_mib) plus 2 x "
        f"{disk_mib} MiB of tmpfs (workdir, /dev/shm); memfd and SysV shared memory are refused "
        "(docs/sandbox.md, limits)"
    )
