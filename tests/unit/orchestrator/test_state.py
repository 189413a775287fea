"""The orchestrator state published with each batch, and what a resume drops."""

import json

from envrl.data.layout import eval_rollouts_file, train_rollouts_file
from envrl.data.samples import write_batch
from envrl.orchestrator.state import OrchestratorState, PendingGroup, load_resume_state, state_bytes
from envrl.runtime.restarts import RestartBudget, RestartPolicy
from tests.support.samples import synthetic_samples


def state(step: int) -> OrchestratorState:
    return OrchestratorState(
        step=step,
        positions={"a": 8 * (step + 1)},
        dispatched=2 * (step + 1),
        counters={"dispatched_rollouts": 8},
        pending=[PendingGroup(env="a", task_idx=3, seed=11)],
    )


def test_resume_reads_the_newest_batch_state_and_drops_lines_and_evals_of_later_steps(tmp_path):
    for step in (0, 1):
        write_batch(tmp_path, step, synthetic_samples(2), extra=state_bytes(state(step)))
    lines = "".join(json.dumps({"step": s, "error": None}) + "\n" for s in (0, 0, 1, 1, 2, 2))
    train_rollouts_file(tmp_path).write_text(lines + '{"step": 2, "err')
    for step in (0, 2):
        eval_rollouts_file(tmp_path, step).parent.mkdir(parents=True, exist_ok=True)
        eval_rollouts_file(tmp_path, step).write_text("{}\n")
    (tmp_path / "rollouts" / ".step_2.tmp").mkdir()  # a batch the crash left half-written

    resumed = load_resume_state(tmp_path)

    assert resumed == state(1)
    assert [json.loads(line)["step"] for line in train_rollouts_file(tmp_path).read_text().splitlines()] == [0, 0, 1, 1]
    assert eval_rollouts_file(tmp_path, 0).exists() and not eval_rollouts_file(tmp_path, 2).exists()


def test_resume_before_the_first_batch_starts_clean(tmp_path):
    train_rollouts_file(tmp_path).parent.mkdir(parents=True)
    train_rollouts_file(tmp_path).write_text(json.dumps({"step": 0}) + "\n")
    assert load_resume_state(tmp_path) is None
    assert train_rollouts_file(tmp_path).read_text() == ""


def test_restart_budget_doubles_its_backoff_and_runs_out():
    budget = RestartBudget(RestartPolicy(max_restarts=3, backoff_s=1.0, max_backoff_s=3.0))
    assert [budget.next_delay() for _ in range(4)] == [1.0, 2.0, 3.0, None]
    assert budget.total == 3 and "restarts.max_restarts = 3" in budget.exhausted()


def test_resume_cuts_the_rollout_file_where_the_newest_batch_was_published(tmp_path):
    """The file is left exactly as it was at the commit of the last published step, without a
    rewrite (a week-long run's file is many GiB)."""
    at_publish = "".join(json.dumps({"step": s, "error": None}) + "\n" for s in (0, 0, 1, 1))
    train_rollouts_file(tmp_path).parent.mkdir(parents=True)
    train_rollouts_file(tmp_path).write_text(at_publish + json.dumps({"step": 2}) + "\n" + '{"step": 2, "err')
    published = state(1).model_copy(update={"train_rollouts_bytes": len(at_publish.encode())})
    write_batch(tmp_path, 1, synthetic_samples(2), extra=state_bytes(published))
    inode = train_rollouts_file(tmp_path).stat().st_ino

    assert load_resume_state(tmp_path) == published
    assert train_rollouts_file(tmp_path).read_text() == at_publish
    assert train_rollouts_file(tmp_path).stat().st_ino == inode, "cut in place, not rewritten"
