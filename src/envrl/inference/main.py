"""`inference --config x.toml`: serves `model.name` on `host:port` with exactly `vllm_args`, on a socket held from
before vLLM is imported, files under `<output_dir>/inference/`; dies with its parent; exit 2 on a config error or
taken port."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import os
import socket
from collections.abc import Sequence
from pathlib import Path

from envrl.config import load_config
from envrl.inference.config import InferenceConfig
from envrl.inference.server import cpu_environment, link_model_info_cache, vllm_args, vllm_environment
from envrl.runtime.cli import check_model, exit_with, one_line_errors
from envrl.telemetry.log import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(InferenceConfig, argv, prog="inference")
    with one_line_errors("inference"):
        check_model(config.model.name)
    try:
        held = hold_port(config.host, config.port)
    except OSError as e:
        exit_with(
            "inference",
            f"port {config.host}:{config.port} is already in use ({e.strerror}); stop what holds it or pass --port",
        )
    setup_logging(config.log, process="inference")
    env = vllm_environment(config)
    for name in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH", "TMPDIR"):
        os.makedirs(env[name], exist_ok=True)
    link_model_info_cache(Path(env["VLLM_CACHE_ROOT"]))
    os.environ.update(env)  # before vLLM is imported: some of its modules read these at import

    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    with one_line_errors("inference"):
        args = vllm_args(config, on_cpu=on_cpu)
    if on_cpu:
        os.environ.update(cpu_environment(eager=args.enforce_eager))  # read by the engine process vLLM starts
    serve_on(held, (args.host or "", args.port))
    uvloop.run(run_server(args, timeout_graceful_shutdown=SHUTDOWN_WAIT_S))


SHUTDOWN_WAIT_S = 5
"""After SIGTERM (vLLM stops its engine first), how long uvicorn waits for requests still open: a
reload the stopped engine never answers would otherwise hold the port until the supervisor's SIGKILL."""
BACKLOG = 2048
"""uvicorn's own backlog: room for the health polls of a start of many minutes."""


def hold_port(host: str, port: int) -> socket.socket:
    """The server's socket, bound as vLLM binds it (SO_REUSEADDR) and listening from now on.

    vLLM binds its port before its engine starts but listens only once it serves (minutes on
    CPU); a bound socket that does not listen shares its port with any user's that also sets
    SO_REUSEADDR, so another local user could listen there first and answer the run (its keys,
    its rollouts). A listening one shares it with no other user. Connections made meanwhile wait
    in the backlog until the server serves."""
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def serve_on(held: socket.socket, address: tuple[str, int]) -> None:
    """Make vLLM serve on `held` where it would bind `address` (its one socket factory)."""
    from vllm.entrypoints.launchers import launcher

    make = launcher.create_server_socket

    def create_server_socket(addr: tuple[str, int], *, reuse_port: bool) -> socket.socket:
        return held if tuple(addr) == address else make(addr, reuse_port=reuse_port)

    launcher.create_server_socket = create_server_socket


if __name__ == "__main__":
    main()
