"""Every process `rl` starts dies with its parent, even while it is still importing torch or vLLM."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from tests.support.env_servers import alive, wait_until

SRC = Path(__file__).parents[2] / "src"
ENTRY_MODULES = [
    "envrl.inference.main",
    "envrl.trainer.main",
    "envrl.orchestrator.main",
    "envrl.serve.main",
    "envrl.serve.worker",
    "envrl.launcher.torchrun",
    "envrl.launcher.host",
    "envrl.runtime.guarded",
]
"""Every module envrl runs as `python -m` in a process it spawns (a module whose package imports
are slow runs as `-m envrl.runtime.guarded MODULE`, which takes the signal for it)."""
BLOCKING_IMPORT = """import os, time
with open(os.environ["ENVRL_TEST_IMPORTING"], "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(60)
"""
"""A stand-in for a heavy dependency: says the import started, then never finishes it."""
PARENT = """import os, sys, time
from envrl.runtime.process import spawn
child = spawn(sys.argv[1:], name="entry point", env={**os.environ, "PYTHONPATH": os.environ["CHILD_PYTHONPATH"]})
print(child.pid, flush=True)
time.sleep(3600)
"""


def _module_file(module: str) -> Path:
    return SRC.joinpath(*module.split(".")).with_suffix(".py")


def test_every_spawned_module_is_a_known_entry_point() -> None:
    spawned = set()
    for path in SRC.rglob("*.py"):
        spawned |= set(re.findall(r'"-m", "(envrl\.[\w.]+)"', path.read_text()))
    assert spawned, "no `python -m envrl...` command found under src/: the pattern above is out of date"
    unknown = spawned - set(ENTRY_MODULES)
    assert not unknown, f"add {sorted(unknown)} to ENTRY_MODULES (and start each with `die_with_parent()`)"


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_entry_point_takes_parent_death_signal_before_any_other_import(module: str) -> None:
    body = ast.parse(_module_file(module).read_text()).body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstring
    body = [s for s in body if not (isinstance(s, ast.ImportFrom) and s.module == "__future__")]
    first, second = ast.unparse(body[0]), ast.unparse(body[1])
    assert (first, second) == ("from envrl.runtime.lifeline import die_with_parent", "die_with_parent()"), (
        f"{_module_file(module)} must start with `from envrl.runtime.lifeline import die_with_parent` and "
        f"`die_with_parent()`, before any other import; it starts with {first!r}, {second!r}"
    )


ARGS = {"envrl.runtime.guarded": ["pydantic"], "envrl.launcher.torchrun": ["x.py"]}
"""What makes the entry point reach a blocking import (the others import pydantic at once)."""


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_entry_point_killed_parent_while_importing_leaves_no_orphan(tmp_path: Path, module: str) -> None:
    """pydantic and torch never finish importing in the child, so it is killed mid-import or never."""
    stubs = tmp_path / "stubs"
    for package in ("pydantic", "torch"):
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text(BLOCKING_IMPORT)
    child_argv = [sys.executable, "-m", module, *ARGS.get(module, [])]
    kill_parent_and_wait(child_argv, stubs, tmp_path / "importing", f"{module} starts importing")


def kill_parent_and_wait(child_argv: list[str], child_path: Path, ready: Path, readiness: str) -> None:
    """A real parent spawns `child_argv` (PYTHONPATH `child_path`); once the child creates `ready`,
    the parent is SIGKILLed and the child must be gone within 30 s."""
    env = {**os.environ, "CHILD_PYTHONPATH": str(child_path), "ENVRL_TEST_IMPORTING": str(ready)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *child_argv], stdout=subprocess.PIPE, text=True, env=env)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_until(ready.exists, 60, f"pid {child}: {readiness}")
        parent.kill()
        parent.wait()
        wait_until(lambda: not alive(child), 30, f"pid {child} ({child_argv[1:3]}) dies with its SIGKILLed parent")
    finally:
        parent.kill()
        parent.wait()
        if child:
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


STUCK_ON_SIGTERM = """import os, signal, time
from envrl.runtime.lifeline import die_with_parent
die_with_parent(kill_after=1.0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a graceful shutdown that never ends
open(os.environ["ENVRL_TEST_IMPORTING"], "w").close()
time.sleep(3600)
"""


def test_an_orphan_stuck_in_its_shutdown_is_killed_after_the_grace(tmp_path: Path) -> None:
    """Nobody is left to escalate once the parent is gone: the child SIGKILLs itself after `kill_after`."""
    child_argv = [sys.executable, "-c", STUCK_ON_SIGTERM]
    kill_parent_and_wait(child_argv, tmp_path, tmp_path / "ready", "ignores SIGTERM")


WAITS_SOMEWHERE = """import asyncio, os
from envrl.runtime.lifeline import die_with_parent
die_with_parent()

async def wait_for_the_model():
    open(os.environ["ENVRL_TEST_IMPORTING"], "w").close()
    await asyncio.sleep(3600)

asyncio.run(wait_for_the_model())
"""


def test_sigusr1_writes_an_entry_points_thread_and_task_stacks_to_its_log_and_it_goes_on(tmp_path: Path) -> None:
    """What the stall watchdog asks of every envrl process (issue 39); SIGUSR1 used to kill them."""
    from envrl.runtime.process import spawn

    ready, log = tmp_path / "ready", tmp_path / "child.log"
    env = {**os.environ, "ENVRL_TEST_IMPORTING": str(ready)}
    child = spawn([sys.executable, "-c", WAITS_SOMEWHERE], name="waiter", log_file=log, env=env)
    try:
        wait_until(ready.exists, 60.0, "the child started waiting")
        os.kill(child.pid, signal.SIGUSR1)
        wait_until(lambda: "wait_for_the_model (<string>:" in log.read_text(), 10.0, "the task's stack in its log")
        text = log.read_text()
        assert "most recent call first" in text, "faulthandler's thread stacks come first"
        assert alive(child.pid)
    finally:
        child.stop(grace=5.0)


def test_only_entry_points_that_keep_the_stacks_handler_are_signalled() -> None:
    """torchrun's agent installs its own SIGUSR1 handling (it would stop the trainer): never signalled."""
    from envrl.runtime.stacks import DUMPING_MODULES

    assert set(DUMPING_MODULES) <= {*ENTRY_MODULES, "envrl.eval.main"}
    assert "envrl.launcher.torchrun" not in DUMPING_MODULES
