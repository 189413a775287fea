"""How the roles of an `rl` run come back: `--resume` added once, back once past what was published."""

from __future__ import annotations

from pathlib import Path

from envrl.launcher.plan.commands import Command
from envrl.launcher.recovery import on_newest_policy, published_past, resumed


def test_a_restarted_trainer_or_orchestrator_runs_its_first_command_with_resume_once(tmp_path: Path) -> None:
    command = Command(name="trainer", argv=["python", "-m", "envrl.trainer.main"], env={"A": "1"}, log_file=tmp_path)
    again = resumed(command)
    assert again.argv == [*command.argv, "--resume"] and again.env == command.env
    assert resumed(again).argv == again.argv


def test_a_role_is_back_once_it_published_past_the_newest_step_at_its_death(tmp_path: Path) -> None:
    (tmp_path / "step_3").mkdir()
    back = published_past(tmp_path)()
    assert not back()
    (tmp_path / "step_2").mkdir()  # a retrained step, published again
    assert not back()
    (tmp_path / "step_4").mkdir()
    assert back()


def test_a_role_that_dies_before_anything_was_published_is_back_at_the_first_step(tmp_path: Path) -> None:
    back = published_past(tmp_path / "weights")()
    assert not back()
    (tmp_path / "weights" / "step_0").mkdir(parents=True)
    assert back()


def test_a_restarted_replica_starts_on_the_newest_policy_under_the_base_models_name(tmp_path: Path) -> None:
    command = Command(name="inference", argv=["python", "-m", "envrl.inference.main"], log_file=tmp_path / "i.log")
    assert on_newest_policy(command, "models/base", tmp_path) == command  # nothing published: the base model
    for step in (1, 2):
        (tmp_path / "weights" / f"step_{step}").mkdir(parents=True)
    newest = str((tmp_path / "weights" / "step_2").resolve())
    argv = on_newest_policy(command, "models/base", tmp_path).argv
    assert argv == [*command.argv, "--model.name", newest, "--vllm.served-model-name", "models/base"]
