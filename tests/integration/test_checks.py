"""Checks that fail loudly (issue 39), on real processes: the orchestrator in this process, its
env servers as sidecars, and a stand-in model server process (tests/support/standin_inference.py)
the train client talks to. No vLLM: the checks read Traces and processes, not the model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest
from loguru import logger

from envrl.config import ModelConfig
from envrl.data.layout import stall_dump_file
from envrl.envclient.config import DeclaredEnvConfig
from envrl.launcher import summary
from envrl.model.tiny import CHAT_TEMPLATE, EOS
from envrl.orchestrator.checks import CheckFailed
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import Orchestrator
from envrl.runtime.stacks import collect_stacks
from envrl.serve.config import PoolConfig
from envrl.telemetry.metrics import WandbConfig, checks_fired, read_metrics
from tests.support.env_servers import alive, raw_exchange, running_env_server, wait_until
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

REPO = Path(__file__).resolve().parents[2]
NO_TOOLS_TEMPLATE = (
    CHAT_TEMPLATE[: CHAT_TEMPLATE.index("{%- if tools -%}")]
    + CHAT_TEMPLATE[CHAT_TEMPLATE.index("{%- for message in messages[ns.first:] -%}") :]
)
"""The tiny model's template without its `if tools` block: it still renders `<tool_call>` in past
assistant turns (so it reads as hermes), but tools given to it are never shown to the model."""
REPLY = "I go left."
"""What the stand-in model answers every turn: no tool call, and compass scores it 0."""


def completion_ids(model_dir: Path) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    return [*tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.convert_tokens_to_ids(EOS)]


@contextmanager
def standin_model_server(model_dir: Path, stop_at: int = 0) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The stand-in inference server process; SIGCONTed and killed at the end, whatever happened."""
    argv = [sys.executable, "-m", "tests.support.standin_inference", str(model_dir),
            json.dumps(completion_ids(model_dir)), str(stop_at)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("port "), f"the stand-in model server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=30)


def model_without_tools(tmp_path: Path) -> Path:
    """The tiny model with a chat template that ignores `tools`."""
    model = tmp_path / "tiny-no-tools"
    shutil.copytree(DEFAULT_DIR, model)
    (model / "chat_template.jinja").write_text(NO_TOOLS_TEMPLATE)
    return model


def compass_run(tmp_path: Path, model: Path, base_url: str, **overrides: object) -> OrchestratorConfig:
    """compass, 2 groups of 2 per step, no trainer needed (each step may use policy 0)."""
    fields: dict[str, object] = dict(
        model=ModelConfig(name=str(model)),
        output_dir=tmp_path / "run",
        max_steps=2,
        max_async_level=1,
        batch_size=4,
        group_size=2,
        max_inflight=4,
        envs=[DeclaredEnvConfig(id="compass", pool=PoolConfig(min_workers=1, max_workers=1))],
        inference={"base_url": base_url},
        wandb=WandbConfig(mode="disabled"),
    )
    fields.update(overrides)
    return OrchestratorConfig.model_validate(fields)


@contextmanager
def warnings_logged() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message).rstrip("\n")), level="WARNING", format="{message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


def test_a_tool_env_whose_template_shows_no_tools_and_whose_rewards_never_vary_warns_naming_both(
    tmp_path: Path,
) -> None:
    model = model_without_tools(tmp_path)
    checks = {"no_tool_call_steps": 2, "zero_variance_steps": 2}
    with standin_model_server(model) as (url, _), warnings_logged() as warned:
        asyncio.run(Orchestrator(compass_run(tmp_path, model, url, checks=checks)).run())
    tool = [line for line in warned if "made no parseable tool call" in line]
    assert tool == [
        f"check: tool env 'compass' made no parseable tool call in 2 steps (to step 1): the chat template of "
        f"{model.resolve()} does not render tools (a tool rendered into it does not appear), so the model never "
        "sees them; use a model whose template renders `tools`, or set the tokenizer to one"
    ]
    flat = [line for line in warned if "every group had equal rewards" in line]
    assert len(flat) == 1 and "for 2 steps (to step 1; rewards [0.0])" in flat[0] and "nothing is learned" in flat[0]
    # each is also a line of metrics.jsonl: what the `rl` console prints, summary.json lists and the run ends with
    out = tmp_path / "run"
    fired = summary.checks(out, ["check: a start-up warning"])
    assert [(c["step"], c["check"], c["message"]) for c in fired] == [
        (None, "plan", "check: a start-up warning"),
        (1, "no_tool_call", tool[0]),
        (1, "zero_variance", flat[0]),
    ]
    summary.write(out, [], summary.Outcome(status="success", reason="completed"), 1.0)
    assert summary.closing_line(out).startswith(
        "the run finished (success) with 2 warning(s) (no_tool_call, zero_variance)"
    )


def test_under_strict_a_tool_env_without_tool_calls_stops_the_run_with_the_cause(tmp_path: Path) -> None:
    model = model_without_tools(tmp_path)
    checks = {"strict": True, "no_tool_call_steps": 1, "zero_variance_steps": 5}
    with standin_model_server(model) as (url, _), pytest.raises(CheckFailed, match="does not render tools"):
        asyncio.run(Orchestrator(compass_run(tmp_path, model, url, checks=checks)).run())


def test_a_model_server_that_stops_answering_gets_every_roles_stacks_dumped_and_strict_stops_the_run(
    tmp_path: Path,
) -> None:
    """Step 0's four rollouts are answered; the stand-in stops itself on step 1's first model call.
    The watchdog's limit is 1 x step 0's time (no floor): whatever that is, step 1 never ends."""
    checks = {"strict": True, "stall_factor": 1.0, "stall_min_s": 0.0}
    with standin_model_server(DEFAULT_DIR, stop_at=5) as (url, standin):
        config = compass_run(tmp_path, DEFAULT_DIR, url, checks=checks, max_steps=3, max_async_level=2)
        with pytest.raises(CheckFailed, match=r"stopped \(orchestrator.checks.strict\): stall: no step finished"):
            asyncio.run(Orchestrator(config).run())
        assert alive(standin.pid), "the stand-in (not an envrl process) was not signalled"
        wait_until(lambda: stopped(standin.pid), 5.0, "the stand-in stays stopped")
    dump = stall_dump_file(config.output_dir, 1).read_text()
    assert dump.startswith("stall: no step finished in ") and "since step 0" in dump
    assert re.search(r"== orchestrator: \d group\(s\) in flight\n  compass task \d+ seed", dump)
    assert "the trainer has published policy 0" in dump
    assert "scheduler.py" in dump and "collect" in dump, "the orchestrator's task waits in Scheduler.collect"
    workers = dump.split("== envrl.serve.worker (pid ")[1:]
    assert workers, "the env server's worker dumped its stacks"
    assert any("envrl/model/inference.py" in part and "generate" in part for part in workers), (
        "a worker's rollout waits in the model call to the stopped server"
    )
    assert "== envrl.serve.main (pid " in dump
    assert "tests.support.standin_inference" not in dump
    assert "== what the steps before waited for" in dump
    [stall] = checks_fired(read_metrics(config.output_dir))
    assert (
        stall["check"] == "stall"
        and stall["step"] == 1
        and str(stall_dump_file(config.output_dir, 1)) in stall["message"]
    )


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_an_env_server_asked_for_its_stacks_keeps_serving(tmp_path: Path) -> None:
    """Before: the env server read SIGUSR1 off its wakeup fd as a stop signal, drained and exited."""
    with running_env_server(tmp_path, env_id="reverse-text", python=sys.executable) as server:
        found = {s.role: s for s in collect_stacks(os.getpid())}
        assert "most recent call first" in found["envrl.serve.main"].stacks
        (answer,) = raw_exchange(server.address, [[msgpack.packb({"id": "h", "method": "health"})]])
        assert answer["ok"], answer
        assert server.child.poll() is None, "the env server still runs"
