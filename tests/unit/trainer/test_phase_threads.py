"""`trainer.phase_threads`: every usable core while the orchestrator waits on the step and
nothing else runs, the start-up count otherwise, decided from the run directory and the
machine's runnable-thread count."""

from pathlib import Path

import pytest
import torch

from envrl.data.layout import batch_dir
from envrl.trainer.parallel import PhaseThreads


@pytest.fixture
def start_threads():
    """Restores the process's torch thread count after a test changed it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def publish(out: Path, step: int) -> None:
    batch_dir(out, step).mkdir(parents=True)


def test_threads_grow_once_the_orchestrator_is_at_its_async_bound(tmp_path: Path, start_threads: None) -> None:
    threads = PhaseThreads(tmp_path, max_async_level=1, max_steps=10, idle=2, running=lambda: 1)
    publish(tmp_path, 3)
    threads.follow(3)  # batch 4 may still be generated
    assert torch.get_num_threads() == 1
    publish(tmp_path, 4)
    threads.follow(3)  # batch 4 is out: the orchestrator waits for policy 4
    assert torch.get_num_threads() == 2
    threads.follow(4)  # batch 5 not yet: generation runs again
    assert torch.get_num_threads() == 1


def test_the_last_step_and_on_policy_steps_never_overlap_generation(tmp_path: Path, start_threads: None) -> None:
    publish(tmp_path, 9)
    PhaseThreads(tmp_path, max_async_level=2, max_steps=10, idle=2, running=lambda: 1).follow(
        9
    )  # no batch 10 or 11 comes
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    publish(tmp_path, 0)
    PhaseThreads(tmp_path, max_async_level=0, max_steps=10, idle=2, running=lambda: 1).follow(0)
    assert torch.get_num_threads() == 2


def test_threads_stay_at_the_start_up_count_while_other_work_runs(tmp_path: Path, start_threads: None) -> None:
    publish(tmp_path, 0)
    running = [3]  # this thread and two of other processes
    threads = PhaseThreads(tmp_path, max_async_level=0, max_steps=10, idle=2, running=lambda: running[0])
    threads.follow(0)
    assert torch.get_num_threads() == 1
    running[0] = 1
    threads.follow(0)
    assert torch.get_num_threads() == 2
    running[0] = 2  # this thread and our own second one, still spinning: nobody else
    threads.follow(0)
    assert torch.get_num_threads() == 2
    running[0] = 3
    threads.follow(0)
    assert torch.get_num_threads() == 1
