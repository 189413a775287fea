"""`env-server`: binds its address before anything slow (a taken port: exit 1 at once), exits 2 with one line for an
env id no package registers, 1 when the env or its workers cannot start, 0 after a drain, and dies with its parent."""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import sys

import zmq
from loguru import logger

from envrl.config import load_config
from envrl.envs.registry import EnvironmentNotFound, load_environment
from envrl.runtime.cli import exit_with
from envrl.serve.config import EnvServerConfig
from envrl.serve.server import EnvServer
from envrl.serve.sockets import ServerSockets
from envrl.telemetry.log import setup_logging


def main(argv: list[str] | None = None) -> None:
    config = load_config(EnvServerConfig, argv, prog="env-server")
    setup_logging(config.log, process="env-server")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sockets = ServerSockets.bind(context, config)  # first, so a taken port fails fast
    except (zmq.ZMQError, ValueError, OSError) as e:
        in_use = getattr(e, "errno", None) == zmq.EADDRINUSE
        reason = "the port is already in use; pick another --address or stop what holds it" if in_use else str(e)
        print(f"env-server: cannot bind {config.address}: {reason}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        # before any worker starts: workers inherit what the load sets up in this process (the
        # openenv adapter starts one OpenEnv app server here and hands its URL down in os.environ)
        env = load_environment(config.env.id, **config.env.args)
        server = EnvServer(config, sockets, env)
    except EnvironmentNotFound as e:
        sockets.close()
        exit_with("env-server", f"--env.id: {e}")
    except Exception as e:
        logger.opt(exception=e).error(f"cannot load environment {config.env.id!r}: {type(e).__name__}: {e}")
        sockets.close()
        raise SystemExit(1) from None
    code = server.serve()
    context.destroy(linger=0)
    logger.info(f"stopped (exit code {code})")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
