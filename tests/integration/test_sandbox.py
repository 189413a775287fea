"""The sandbox API on the bubblewrap backend: a session that persists, caps, typed failures, cleanup."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from envrl.sandbox import (
    BubblewrapProvider,
    BubblewrapSandbox,
    Limits,
    SandboxClosed,
    SandboxConfig,
    SandboxDied,
    SandboxStartError,
    SandboxTimeout,
    WarmPool,
)
from tests.support.sandboxes import processes_of, run_dir, wait_gone

__all__ = ["run_dir"]


def test_files_and_background_processes_persist_across_calls(run_dir: Path) -> None:
    async def main() -> None:
        async with await BubblewrapProvider().create(SandboxConfig()) as box:
            await box.write_file("answer.py", "print(6 * 7)")
            assert (await box.run(["python3", "answer.py"])).stdout == "42\n"
            await box.run("sleep 60 >/dev/null 2>&1 &")
            ps = await box.run("ls /proc | grep -c '^[0-9]'")
            assert int(ps.stdout) >= 4  # init, agent, the earlier sleep, this shell (and its ls/grep)
            assert await box.read_file("answer.py") == b"print(6 * 7)"
            with pytest.raises(FileNotFoundError):
                await box.read_file("missing.txt")
            assert len(processes_of(box.uid)) >= 3
            uid = box.uid
        assert wait_gone(uid) == []
        assert list(run_dir.iterdir()) == []

    asyncio.run(main())


def test_command_output_is_cut_at_the_limit_and_stdin_is_passed() -> None:
    async def main() -> None:
        config = SandboxConfig(limits=Limits(max_output_kib=1))
        async with await BubblewrapProvider().create(config) as box:
            big = await box.run("python3 -c 'print(\"x\" * 100000)'")
            assert big.truncated and len(big.stdout) == 1024
            echoed = await box.run("cat", stdin="hello")
            assert echoed.stdout == "hello" and echoed.exit_code == 0

    asyncio.run(main())


def test_a_command_past_its_timeout_is_killed_and_the_session_goes_on() -> None:
    async def main() -> None:
        async with await BubblewrapProvider().create(SandboxConfig()) as box:
            result = await box.run("sleep 30", timeout=0.3)
            assert result.timed_out and result.limit == "timeout"
            assert (await box.run("echo still here")).stdout == "still here\n"

    asyncio.run(main())


def test_the_episode_cap_counts_start_up_and_ends_the_sandbox() -> None:
    async def main() -> None:
        box = BubblewrapSandbox(SandboxConfig(episode_s=1.5))
        await box.start()
        with pytest.raises(SandboxTimeout, match="episode_s"):
            await box.run("sleep 30", timeout=30)
        assert wait_gone(box.uid) == []
        with pytest.raises(SandboxTimeout):  # the cause stays the answer
            await box.run("true")

    asyncio.run(main())


def test_an_idle_sandbox_is_killed_when_its_episode_cap_runs_out() -> None:
    async def main() -> None:
        box = BubblewrapSandbox(SandboxConfig(episode_s=2))
        await box.start()
        await box.run("sleep 60 >/dev/null 2>&1 &")
        await asyncio.sleep(box.deadline - time.monotonic() + 0.2)
        assert wait_gone(box.uid) == []
        with pytest.raises(SandboxTimeout):
            await box.run("true")
        await box.close()

    asyncio.run(main())


def test_an_unreadable_image_fails_to_start_with_a_typed_error(tmp_path: Path) -> None:
    async def main() -> None:
        hidden = tmp_path / "image"  # under pytest's 0700 base directory
        hidden.mkdir()
        with pytest.raises(SandboxStartError, match="not reachable by an unprivileged user") as raised:
            await BubblewrapProvider().create(SandboxConfig(image=[Path("/usr"), hidden]))
        assert raised.value.error_type == "sandbox_start"

    asyncio.run(main())


def test_a_killed_agent_is_a_typed_death_not_a_hang() -> None:
    async def main() -> None:
        box = await BubblewrapProvider().create(SandboxConfig())
        with pytest.raises(SandboxDied) as raised:
            await box.run("kill -9 $PPID; sleep 5")  # the agent is this shell's parent
        assert raised.value.error_type == "sandbox_died"
        assert wait_gone(box.uid) == []
        await box.close()

    asyncio.run(main())


def test_close_during_a_running_command_leaves_nothing() -> None:
    async def main() -> None:
        box = await BubblewrapProvider().create(SandboxConfig())
        running = asyncio.create_task(box.run("sleep 30"))
        await asyncio.sleep(0.2)
        running.cancel()
        await box.close()
        assert wait_gone(box.uid) == []
        with pytest.raises((asyncio.CancelledError, SandboxClosed, SandboxDied)):
            await running

    asyncio.run(main())


def test_a_warm_pool_is_bounded_hands_each_sandbox_to_one_episode_and_closes_what_it_holds() -> None:
    async def main() -> None:
        config = SandboxConfig(episode_s=60)
        pool = WarmPool(BubblewrapProvider(), config, size=2)
        first = await pool.create(config)  # cold: the pool fills behind it
        await asyncio.sleep(0)
        while len(pool._ready) < 2:
            await asyncio.sleep(0.05)
        assert len(pool._ready) + len(pool._starting) == 2
        warm = await pool.create(config)
        assert warm is not first and warm.alive and warm.deadline > first.deadline  # its cap starts now
        await warm.write_file("mark", "episode one")
        await warm.close()
        other = await pool.create(config)
        with pytest.raises(FileNotFoundError):
            await other.read_file("mark")  # a used sandbox never comes back
        held = [*pool._ready]
        await pool.aclose()
        for box in [first, other]:
            await box.close()
        for box in [first, warm, other, *held]:
            assert wait_gone(box.uid) == []

    asyncio.run(main())
