"""`inference --config x.toml`: serve `model.name` with vLLM plus `POST /update_weights`.

Guarantee: the process serves on `host:port` with exactly the engine options `vllm_args` builds,
keeps every file vLLM writes under `<output_dir>/inference/` (its environment is set before vLLM
is imported) except the model-class records runs share, dies with its parent, and exits 2 on a
config error (unknown vLLM options included).
"""

from __future__ import annotations

from envrl.runtime.lifeline import die_with_parent

die_with_parent()  # first: a parent that dies while the imports below load leaves no orphan

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from envrl.config import ConfigError, load_config
from envrl.inference.config import InferenceConfig
from envrl.inference.server import cpu_environment, link_model_info_cache, vllm_args, vllm_environment
from envrl.runtime.net import port_is_free
from envrl.telemetry.log import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(InferenceConfig, argv, prog="inference")
    if not port_is_free(config.host, config.port):
        print(
            f"inference: port {config.host}:{config.port} is already in use; stop what holds it or pass --port",
            file=sys.stderr,
        )
        raise SystemExit(2)
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
    try:
        args = vllm_args(config, on_cpu=on_cpu)
    except ConfigError as e:
        print(f"inference: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if on_cpu:
        os.environ.update(cpu_environment(eager=args.enforce_eager))  # read by the engine process vLLM starts
    uvloop.run(run_server(args))


if __name__ == "__main__":
    main()
