"""Sandbox pieces that need no sandbox: limits as prlimit options, limit reading, errors, the run directory."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import pytest

from envrl.sandbox import (
    CommandResult,
    Limits,
    Sandbox,
    SandboxConfig,
    SandboxLimit,
    SandboxOOM,
    SandboxProvider,
    SandboxTimeout,
    WarmPool,
    reaper,
)
from envrl.sandbox.argv import bwrap_argv
from envrl.sandbox.errors import SandboxStartError


def test_limits_become_equal_soft_and_hard_prlimit_options() -> None:
    argv = Limits(cpu_s=5, memory_mib=100, nproc=8, nofile=32, file_mib=2).prlimit_argv()
    assert argv[0] == "prlimit" and argv[-1] == "--"
    assert {"--cpu=5:6", f"--as={100 << 20}", "--nproc=8", "--nofile=32", f"--fsize={2 << 20}", "--core=0"} <= set(argv)


@pytest.mark.parametrize(
    ("result", "limit", "raised"),
    [
        (CommandResult(0, "ok", ""), None, None),
        (CommandResult(-9, "", "", timed_out=True), "timeout", SandboxTimeout),
        (CommandResult(-24, "", ""), "cpu", SandboxLimit),
        (CommandResult(-25, "", ""), "file_size", SandboxLimit),
        (CommandResult(1, "", "Traceback ...\nMemoryError\n"), "memory", SandboxOOM),
        (CommandResult(1, "", "OSError: [Errno 28] No space left on device"), "disk", SandboxLimit),
    ],
)
def test_a_result_names_the_limit_it_hit_and_raises_its_typed_error(result, limit, raised) -> None:
    assert result.limit == limit
    if raised is None:
        assert result.raise_for_limit() is result
    else:
        with pytest.raises(raised) as error:
            result.raise_for_limit()
        assert error.value.error_type.startswith("sandbox_")


def _argv(config: SandboxConfig) -> list[str]:
    return bwrap_argv(config, 1_999_000_009, None, agent_fds=(7, 8), seccomp_fd=9)


def test_the_default_argv_isolates_everything_and_shares_no_network() -> None:
    argv = _argv(SandboxConfig())
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv", "--cap-drop"):  # fmt: skip
        assert flag in argv
    assert argv[argv.index("--seccomp") + 1] == "9" and argv[-2:] == ["7", "8"]  # the agent's pipes, on its argv
    assert "--share-net" not in argv
    assert "--share-net" in _argv(SandboxConfig(network=True))


def test_an_image_under_the_sandboxes_own_tmp_is_refused() -> None:
    with pytest.raises(SandboxStartError, match="sandbox's own"):
        _argv(SandboxConfig(image=[Path("/usr"), Path("/tmp")]))


def test_a_loosened_run_directory_is_refused_for_a_private_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(shared))
    private = reaper.run_dir()
    assert private != shared and private.parent == tmp_path and private.name.startswith("shared-")
    assert private.stat().st_mode & 0o777 == 0o700 and reaper.run_dir() == private  # the same one, every call
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(tmp_path / "fresh"))
    assert reaper.run_dir().stat().st_mode & 0o777 == 0o700


def test_records_of_dead_owners_and_garbage_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(reaper.RUN_DIR_ENV, str(tmp_path / "run"))
    record = reaper.Record(uid=1_999_000_003, owner=2**22 + 8, owner_start=1)
    record.path.write_text(json.dumps(dataclasses.asdict(record)))
    (reaper.run_dir() / "garbage.json").write_text("not json")
    assert [r.uid for r in reaper.reap()] == [record.uid]
    assert list(reaper.run_dir().iterdir()) == []
    assert reaper.start_time(os.getpid()) is not None


class _Box(Sandbox):
    """A sandbox that runs nothing: for the pool's bookkeeping."""

    closed = False

    async def start(self) -> None:
        pass

    async def run(self, cmd, *, timeout=None, stdin=None, cwd=None, isolate=False, env=None) -> CommandResult:  # noqa: ANN001
        return CommandResult(0, "", "")

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        pass

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return b""

    async def close(self) -> None:
        self.closed = True


class _Provider(SandboxProvider):
    def __init__(self) -> None:
        self.made: list[_Box] = []

    async def create(self, config: SandboxConfig) -> Sandbox:
        self.made.append(_Box(config))
        return self.made[-1]


def test_a_warm_pool_hands_out_sandboxes_it_prepared_and_closes_those_it_could_not() -> None:
    prepared: list[Sandbox] = []

    async def prepare(box: Sandbox) -> None:
        if len(prepared) == 1:
            prepared.append(box)
            raise RuntimeError("the program did not start")
        prepared.append(box)

    async def main() -> tuple[_Provider, list[Sandbox]]:
        provider, config = _Provider(), SandboxConfig()
        pool = WarmPool(provider, config, size=2, prepare=prepare)
        first = await pool.create(config)  # nothing warm yet: started for the caller, not prepared
        while len(pool._ready) < 1 or pool._starting:
            await asyncio.sleep(0.01)
        handed = [first, await pool.create(config)]
        await pool.aclose()
        return provider, handed

    provider, (first, second) = asyncio.run(main())
    assert first not in prepared and second is prepared[0]  # the pool's prepared one
    assert prepared[1].closed  # the one whose preparation failed was closed, never handed out
    assert [box.closed for box in provider.made if box not in (first, second, prepared[1])] == [True] * (
        len(provider.made) - 3
    )  # what was still warm at aclose was closed
