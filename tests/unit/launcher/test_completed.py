"""`rl --resume` of a run that already trained its `max_steps` says the run is complete and how to
extend it, exits 0 and starts nothing (it used to start vLLM and every process, then fail with
"trainer exited with code 0")."""

from pathlib import Path

import pytest

from envrl.config import resolve_config
from envrl.launcher.completed import completed_run
from envrl.launcher.config import RLConfig
from envrl.launcher.main import main
from envrl.launcher.run_dir import prepare, write_user_config

STEPS = 3


def a_run_that_trained(out: Path, steps: int) -> None:
    """What `rl` leaves after `steps` steps of a STEPS-step run: marker, stored config, checkpoint, metrics."""
    overrides = [("orchestrator.envs", '[{"id": "reverse-text"}]'), ("output-dir", str(out)), ("max-steps", str(STEPS))]
    rl = resolve_config(RLConfig, overrides=overrides)
    prepare(rl)
    write_user_config(rl)
    (out / "checkpoints" / f"step_{steps}").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')


def test_resuming_a_complete_run_says_so_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_run_that_trained(tmp_path, STEPS)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 0
    err = capsys.readouterr().err
    assert f"the run in {tmp_path} is complete: its checkpoint is at step {STEPS} and max_steps is {STEPS}" in err
    assert f"--max-steps {2 * STEPS}" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no log, config or process


def test_a_resume_with_steps_left_is_not_complete(tmp_path: Path) -> None:
    a_run_that_trained(tmp_path, STEPS - 1)
    base = [("output-dir", str(tmp_path)), ("orchestrator.envs", '[{"id": "reverse-text"}]'), ("resume", None)]
    assert completed_run(resolve_config(RLConfig, overrides=[*base, ("max-steps", str(STEPS))])) is None
    assert completed_run(resolve_config(RLConfig, overrides=[*base, ("max-steps", str(STEPS - 1))])) is not None
    more = [*base, ("max-steps", str(STEPS)), ("trainer.ckpt.resume-step", str(STEPS))]
    assert completed_run(resolve_config(RLConfig, overrides=more)) is not None  # resuming at a step past the end
