"""The `eval` entry point without servers: its config, resume planning, dispatch bound, summary."""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from envrl.config import load_config, resolve_config
from envrl.data.rollout_lines import parse_trace_line, trace_line
from envrl.data.seeds import eval_seed
from envrl.data.traces import Error, Trace, WireTask
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.eval_grid import EvalGrid, run_grids
from envrl.envclient.plan import SIDECAR_ADDRESS
from envrl.eval.config import EvalCommandConfig, EvalCommandEnvConfig, EvalInputError, eval_envs
from envrl.eval.main import main as eval_main
from envrl.eval.progress import EvalProgress
from envrl.eval.resume import check_earlier_results
from envrl.eval.runner import Evaluation
from envrl.eval.summary import format_summary
from envrl.model.client import EvalClientConfig, ScriptedClientConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.loop import orchestrator_envs
from envrl.telemetry.progress import CLEAR_LINE, LiveLines


def config(tmp_path: Path, *argv: str) -> EvalCommandConfig:
    return load_config(EvalCommandConfig, ["--output-dir", str(tmp_path), *argv], prog="eval")


def good(task: int, reward: float = 1.0) -> Trace:
    return Trace(task=WireTask(idx=task), reward=reward)


def errored(task: int) -> Trace:
    return Trace.from_error(WireTask(idx=task), Error(type="boom", message="failed"))


def test_short_flags_and_a_single_env_table(tmp_path: Path) -> None:
    c = config(
        tmp_path,
        "--env.id",
        "reverse-text",
        "-n",
        "20",
        "-r",
        "3",
        "--client.base-url",
        "http://h:1/v1",
        "--client.model",
        "m",
    )
    assert [(e.id, e.num_examples, e.rollouts_per_example) for e in c.env] == [("reverse-text", 20, 3)]
    assert c.client == EvalClientConfig(base_url="http://h:1/v1", model="m")


def test_n_and_r_replace_every_envs_own_values_only_when_given(tmp_path: Path) -> None:
    toml = tmp_path / "eval.toml"
    toml.write_text("[[env]]\nid = 'a'\nnum_examples = 5\n[[env]]\nid = 'b'\nrollouts_per_example = 4\n")
    own = config(tmp_path, "--config", str(toml))
    assert [(e.num_examples, e.rollouts_per_example) for e in own.env] == [(5, 1), (16, 4)]
    both = config(tmp_path, "--config", str(toml), "-n", "2", "-r", "3")
    assert [(e.num_examples, e.rollouts_per_example) for e in both.env] == [(2, 3), (2, 3)]


def test_chat_client_keys_change_the_default_chat_client(tmp_path: Path) -> None:
    c = config(tmp_path, "--env.id", "x", "--client.base-url", "http://h:1/v1")
    assert c.client == EvalClientConfig(base_url="http://h:1/v1", model="deps/models/tiny-chat")


def test_client_type_is_still_selectable(tmp_path: Path) -> None:
    c = config(tmp_path, "--env.id", "x", "--client.type", "scripted", "--client.replies", '["a"]')
    assert c.client == ScriptedClientConfig(replies=["a"])


def test_resume_writes_into_the_earlier_output_dir(tmp_path: Path) -> None:
    c = load_config(EvalCommandConfig, ["--env.id", "x", "--resume", str(tmp_path)], prog="eval")
    assert c.output_dir == tmp_path and c.results_file("x") == tmp_path / "eval" / "x.jsonl"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env.id", "x", "--resume", "a", "--output-dir", "b"], "drop --output-dir b"),
        (["--env", '[{"id": "x"}, {"id": "x"}]'], "['x'] used twice"),
        (["--env.id", "x", "-n", "0"], "'num_examples'"),
        (["--env.id", "x", "--env.sampling", '{"temprature": 0}'], "unknown sampling keys ['temprature']"),
        (["-n", "3"], "missing required config key 'env'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(EvalCommandConfig, argv, prog="eval")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err


def write_results(path: Path, env: str, rows: list[tuple[int, Trace] | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(row if isinstance(row, str) else trace_line(row[1], env=env, rollout=row[0]) for row in rows)
    )


def planned(tmp_path: Path, *, group_scoring: bool, rows: list[tuple[int, Trace] | str]) -> list[tuple[int, list[int]]]:
    """The (task, rollouts) units a resumed 3 x 2 eval of env 'e' would dispatch."""
    c = config(tmp_path, "--env.id", "e", "-n", "3", "-r", "2", "--resume", str(tmp_path))
    write_results(c.results_file("e"), "e", rows)
    evaluation = Evaluation(c)
    env = evaluation.envs[0]
    env.num_tasks, env.group_scoring = 10, group_scoring
    return [(u.task_idx, u.rollouts) for u in evaluation.plan(env).units()]


def test_resume_reruns_missing_errored_and_unreadable_pairs_and_the_later_line_wins(tmp_path: Path) -> None:
    rows: list[tuple[int, Trace] | str] = [
        (0, good(0)),
        (1, good(0)),  # task 0 complete
        (0, errored(1)),
        (0, good(1)),  # errored, then a later success: kept
        (1, good(1)),
        (1, errored(1)),  # a success, then a later error: re-run
        (0, good(2)),  # task 2 rollout 1 missing
        trace_line(good(2), env="other", rollout=1),  # another env's line is not this env's rollout
        '{"env": "e", "rollout": 0, "task": {"idx": 2}, "rew',  # cut short by a crash
    ]
    assert planned(tmp_path, group_scoring=False, rows=rows) == [(1, [1]), (2, [1])]


def test_a_rerun_pair_samples_with_a_fresh_seed_after_each_earlier_attempt(tmp_path: Path) -> None:
    c = config(tmp_path, "--env.id", "e", "-n", "2", "-r", "1", "--resume", str(tmp_path))
    write_results(c.results_file("e"), "e", [(0, errored(0)), (0, errored(0)), (0, good(1))])
    evaluation = Evaluation(c)
    env = evaluation.envs[0]
    env.num_tasks, env.group_scoring = 10, False
    grid = evaluation.plan(env)
    [unit] = grid.units()
    assert (unit.task_idx, unit.rollouts) == (0, [0])
    # Run twice before, each run spending attempts 0..max_retries: the re-run starts past them (attempt_seed salts it).
    assert grid.seed_of(unit) == (eval_seed(0, 0, 0, 1), 2 * (env.config.max_retries + 1))


def test_group_scored_envs_rerun_whole_tasks(tmp_path: Path) -> None:
    rows: list[tuple[int, Trace] | str] = [(0, good(0)), (1, good(0)), (0, good(1)), (1, errored(1))]
    assert planned(tmp_path, group_scoring=True, rows=rows) == [(1, [0, 1]), (2, [0, 1])]


def test_resume_refuses_results_outside_the_grid(tmp_path: Path) -> None:
    with pytest.raises(EvalInputError, match="task 5 rollout 0, outside this eval's 3 tasks x 2 rollouts"):
        planned(tmp_path, group_scoring=False, rows=[(0, good(5))])


def test_more_examples_than_the_env_has_evaluates_all_of_them(tmp_path: Path) -> None:
    evaluation = Evaluation(config(tmp_path, "--env.id", "e", "-n", "50"))
    env = evaluation.envs[0]
    env.num_tasks = 4
    assert [u.task_idx for u in evaluation.plan(env).units()] == [0, 1, 2, 3]


def test_earlier_results_without_resume_are_refused(tmp_path: Path) -> None:
    c = config(tmp_path, "--env.id", "e")
    write_results(c.results_file("e"), "e", [(0, good(0))])
    with pytest.raises(EvalInputError, match=f"--resume {tmp_path}"):
        check_earlier_results(c, ["e"])


class Gauge:
    def __init__(self) -> None:
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)


class CountingEnv:
    """Stands in for a started `EnvHandle`: answers run_group after a pause, counting rollouts in flight."""

    def __init__(self, name: str, group_scoring: bool, gauge: Gauge) -> None:
        self.name, self.group_scoring, self.num_tasks = name, group_scoring, 100
        self.config = EvalCommandEnvConfig(id=name, num_examples=5, rollouts_per_example=3)
        self.gauge = gauge
        self.calls: list[int] = []
        self.seeds: list[int] = []
        self.attempts: dict[int, int] = {}
        """The attempt each call started at, by its first rollout's seed."""

    async def run_group(self, task_idx: int, n: int, seed: int, attempt: int = 0) -> list[Trace]:
        self.attempts[seed] = attempt
        self.gauge.add(n)
        self.calls.append(n)
        self.seeds += [seed + i for i in range(n)]
        await asyncio.sleep(0.01)
        self.gauge.add(-n)
        return [good(task_idx, reward=float(task_idx % 2)) for _ in range(n)]


def test_rollouts_in_flight_stay_within_max_inflight_and_results_land_in_grid_order(tmp_path: Path) -> None:
    evaluation = Evaluation(config(tmp_path, "--env.id", "single", "--max-inflight", "4"))
    gauge = Gauge()
    envs = [
        CountingEnv("single", group_scoring=False, gauge=gauge),
        CountingEnv("grouped", group_scoring=True, gauge=gauge),
    ]
    grids = [EvalGrid(env, env.config, seed=0) for env in envs]  # type: ignore[arg-type]
    asyncio.run(evaluation.run_grids(grids))
    assert gauge.peak == 4, "the bound holds across envs"
    assert envs[0].calls == [1] * 15 and envs[1].calls == [3] * 5, "single rollouts one by one, groups whole"
    assert sorted(envs[0].seeds) == sorted(envs[1].seeds) == list(range(15)), "one seed per (task, rollout)"

    summary = evaluation.finish(grids[0])
    lines = [parse_trace_line(line) for line in evaluation.config.results_file("single").read_text().splitlines()]
    assert [(f["rollout"], t.task.idx) for f, t in lines] == [(j, i) for i in range(5) for j in range(3)]
    assert summary["reward"] == pytest.approx(2 / 5) and summary["pass@1"] == pytest.approx(2 / 5)
    assert summary["pass@3"] == pytest.approx(2 / 5) and summary["tasks"] == 5 and summary["rollouts"] == 15


def test_the_orchestrators_evals_and_the_eval_command_sample_the_same_seeds() -> None:
    """One runner: a grid run on its own (as the orchestrator does) gets the command's seeds."""
    env = CountingEnv("single", group_scoring=False, gauge=Gauge())
    asyncio.run(run_grids([EvalGrid(env, env.config, seed=3)], max_inflight=2))  # type: ignore[arg-type]
    assert sorted(env.seeds) == sorted(eval_seed(3, i, j, 3) for i in range(5) for j in range(3))


def test_summary_table_has_one_row_per_env_and_dashes_for_unknown_tokens() -> None:
    m = {
        "tasks": 4.0,
        "rollouts_per_example": 2.0,
        "reward": 0.5,
        "error_rate": 0.25,
        "pass@1": 0.5,
        "pass@2": 0.75,
        "completion_len": 0.0,
        "total_tokens": 0.0,
    }
    table = format_summary({"reverse-text": m, "learnable": {**m, "completion_len": 12.0, "total_tokens": 40.0}})
    header, first, second = table.splitlines()
    assert header.split()[:7] == ["env", "tasks", "r", "reward", "errors", "pass@1", "pass@r"]
    assert first.split() == ["reverse-text", "4", "2", "0.500", "25.0%", "0.500", "0.750", "-", "-"]
    assert second.split()[-2:] == ["12.0", "40.0"]


def test_a_rerun_starts_past_every_attempt_its_earlier_runs_spent_on_retries() -> None:
    env = CountingEnv("single", group_scoring=False, gauge=Gauge())
    grid = EvalGrid(env, env.config, seed=0)  # type: ignore[arg-type]
    grid.resume({}, Counter({(0, 0): 2}))  # two earlier lines, each after attempts 0..max_retries
    asyncio.run(run_grids([grid], max_inflight=1))
    assert env.attempts[eval_seed(0, 0, 0, 3)] == 2 * (env.config.max_retries + 1)
    assert env.attempts[eval_seed(0, 1, 0, 3)] == env.attempts[eval_seed(0, 0, 1, 3)] == 0


class Terminal(io.StringIO):
    """What a terminal receives: a text stream that says it is a TTY."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eval_progress_off_a_terminal_prints_the_first_line_then_at_most_every_interval_and_the_last() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = EvalProgress({"a": 4, "b": 2}, LiveLines(stream), interval=5.0, clock=clock)
    for now, env, traces in [
        (1.0, "a", [good(0, 1.0)]),  # the first: printed
        (2.0, "b", [errored(0)]),  # 1 s later: not printed
        (6.0, "a", [good(1, 0.0)]),  # 5 s after the first: printed
        (7.0, "a", [good(2, 0.5)]),  # not printed
        (8.0, "b", [good(1, 1.0)]),  # not printed
        (8.0, "a", [good(3, 0.5)]),  # the last: printed
    ]:
        clock.now = now
        progress.add(env, traces)

    lines = stream.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "rollouts 1/6 (17%)",
        "rollouts 3/6 (50%)",
        "rollouts 6/6 (100%)",
    ]
    assert lines[0] == (
        "rollouts 1/6 (17%) | 1.00 rollouts/s | errors 0 | ETA 5s | a 1/4 reward 1.000 errors 0 | b 0/2 reward n/a errors 0"
    )
    assert lines[-1].endswith("errors 1 | ETA 0s | a 4/4 reward 0.500 errors 0 | b 2/2 reward 1.000 errors 1")
    assert "\r" not in stream.getvalue(), "no terminal control codes in a log"


def test_eval_progress_on_a_terminal_keeps_a_status_line_and_leaves_the_last_line() -> None:
    stream, clock = Terminal(), Clock()
    lines = LiveLines(stream)
    progress = EvalProgress({"a": 2}, lines, clock=clock)
    clock.now = 1.0
    progress.add("a", [good(0)])
    assert stream.getvalue() == "rollouts 1/2 (50%) | 1.00 rollouts/s | errors 0 | ETA 1s | a 1/2 reward 1.000 errors 0"
    lines.write("12:00:00 INFO a log record\n")
    clock.now = 2.0
    progress.add("a", [good(1)])

    shown = stream.getvalue().split(CLEAR_LINE)
    assert shown[1] == "12:00:00 INFO a log record\n" + shown[0], "a record goes above the status line"
    assert shown[-1].startswith("rollouts 2/2 (100%)") and shown[-1].endswith("errors 0\n"), (
        "the status line is gone at the end, the last line stays"
    )


def test_rl_eval_plans_a_server_serving_its_client_for_each_env_without_an_address(tmp_path: Path) -> None:
    envs = '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "far", "address": "tcp://127.0.0.1:7900"}]'
    c = config(tmp_path, "--env", envs, "--restarts.max-restarts", "5")
    planned = eval_envs(c)
    assert [(env.split, env.name, env.env.address) for env in planned] == [
        ("eval", "reverse-text", None), ("eval", "far", "tcp://127.0.0.1:7900"),
    ]  # fmt: skip
    server = planned[0].server
    assert server is not None and planned[1].server is None
    assert server.config.address == SIDECAR_ADDRESS and server.restarts.max_restarts == 5
    assert planned[0].client == c.client
    assert server.config.client == c.client
    server_keys, client_keys = sidecar_keys(tmp_path)  # eval's sidecar admits only eval's own key
    assert server.config.curve == server_keys and planned[0].env.curve == client_keys and planned[1].env.curve is None
    assert list(tmp_path.iterdir()) == []  # planned, nothing written


def test_rl_eval_runs_an_env_on_its_own_client_by_the_orchestrators_rule(tmp_path: Path) -> None:
    teacher = {"base_url": "https://api.example.com/v1", "model": "teacher", "api_key_env": "TEACHER_KEY"}
    envs = [{"id": "reverse-text", "name": "taught", "client": teacher}, {"id": "reverse-text"}]
    c = config(tmp_path, "--env", json.dumps(envs))
    taught, plain = eval_envs(c)
    assert isinstance(taught.client, EvalClientConfig) and taught.client.base_url == teacher["base_url"]
    assert plain.client == c.client  # an env without a client of its own: eval's --client
    assert taught.server is not None and taught.server.allowed_env() == ["TEACHER_KEY"]
    for env in (taught, plain):  # each server serves exactly the client its handle uses
        assert env.server is not None and env.server.config.client == env.client
    declared = [{**envs[0], "name": "taught"}]  # the same env under the orchestrator: the same client
    orchestrator = resolve_config(OrchestratorConfig, overrides=[("envs", json.dumps(declared))])
    assert orchestrator_envs(orchestrator)[0].client == taught.client


def test_rl_eval_dry_run_prints_the_config_and_each_env_servers_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        eval_main(["--env.id", "reverse-text", "--output-dir", str(tmp_path), "--dry-run"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("# ")] == [
        "# eval",
        "# eval env server 'reverse-text', spawned on a free loopback port; variables beyond the allow-list: nothing",
        f"# it admits only the holder of {tmp_path}/curve/clients/orchestrator.key_secret (CURVE keys made before it starts)",
    ]
    assert out.count("-m envrl.serve.main") == 1 and '[client]\nbase_url = "http://127.0.0.1:8000/v1"' in out
    assert list(tmp_path.iterdir()) == []
