"""A resume from an earlier step than the run reached (issue 37): the checkpoints the abandoned
run left past that step are moved aside, never deleted, and pruning keeps the ones just written."""

from envrl.data.layout import abandoned_checkpoints_dir
from envrl.trainer.checkpoint import list_checkpoints
from tests.support.run_files import write_batches
from tests.support.trainers import make_trainer


def test_a_resume_from_an_earlier_step_keeps_its_new_checkpoints_and_sets_the_later_ones_aside(tmp_path):
    write_batches(tmp_path, 3)
    make_trainer(tmp_path, max_steps=3, **{"ckpt.interval": 1, "ckpt.keep": 3}).run()
    assert list_checkpoints(tmp_path) == [1, 2, 3]

    # step_2 is written again and step_3 (past the new run's end) is never reached: both go aside;
    # keep = 1 prunes step_1 and keeps the new step_2, not the abandoned, later step_3.
    make_trainer(tmp_path, max_steps=2, **{"ckpt.interval": 1, "ckpt.keep": 1, "ckpt.resume_step": 1}).run()
    assert list_checkpoints(tmp_path) == [2]
    aside = abandoned_checkpoints_dir(tmp_path)
    assert sorted(p.name for p in aside.iterdir()) == ["step_2", "step_3"]
    assert all((aside / name / "trainer_state.pt").is_file() for name in ("step_2", "step_3"))
