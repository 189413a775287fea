"""The env servers an `rl` run starts: the envs the orchestrator would spawn, planned by the one env
planner (`envclient/plan.py`) on fixed ports of one host behind the run's CURVE keys."""

from __future__ import annotations

from typing import TypeVar
from urllib.parse import urlsplit

from envrl.data import layout
from envrl.data.traces import Split
from envrl.envclient.config import EnvConfig
from envrl.envclient.curve import curve_keys
from envrl.envclient.plan import env_plan
from envrl.launcher.config import EVAL_PORT_OFFSET, RLConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.secrets import API_KEY_ENV
from envrl.serve.launch import EnvServerLaunch

E = TypeVar("E", bound=EnvConfig)


def env_servers(
    rl: RLConfig, orchestrator: OrchestratorConfig, host: str
) -> tuple[OrchestratorConfig, list[EnvServerLaunch]]:
    """The env servers `rl` starts on `host`, as the env planner (`env_plan`) places the
    orchestrator's envs on the run's ports behind the run's CURVE keys, and the orchestrator
    pointed at them: every env it runs then has an address, so it spawns none."""
    keys = curve_keys(layout.curve_dir(rl.output_dir))
    urls = orchestrator.inference.base_urls
    served = orchestrator.model_copy(update={"envs": [_with_run_key(env, urls) for env in orchestrator.envs]})
    base = rl.env_server_base_port

    def address(split: Split, i: int) -> str:  # train env i: base + i; eval table i: base + EVAL_PORT_OFFSET + i
        return f"tcp://{host}:{base + (EVAL_PORT_OFFSET if split == 'eval' else 0) + i}"

    client = served.train_client()
    planned = env_plan(served.train_envs, served.eval_envs(), client, served.restarts, curve=keys, address=address)
    trained = {env.name: env.env for env in planned if env.split == "train"}
    declared = [
        trained.get(env.resolved_name)
        or (env if env.address is not None else env.model_copy(update={"curve": keys[1]}))  # an eval-only env
        for env in served.envs
    ]
    addresses = {env.name: env.env.address for env in planned if env.split == "eval" and env.server is not None}
    evals = served.eval.model_copy(update={"addresses": addresses})
    servers = [env.server for env in planned if env.server is not None]
    return served.model_copy(update={"envs": declared, "eval": evals}), servers


def _with_run_key(env: E, urls: list[str]) -> E:
    """`env` with its chat client sending the run's API key when it calls the run's inference (`rl`
    makes one per run), unless it names a key variable itself."""
    client = env.client
    run_netlocs = {urlsplit(url).netloc for url in urls}
    if client is None or client.api_key_env is not None or urlsplit(client.base_url).netloc not in run_netlocs:
        return env
    return env.model_copy(update={"client": client.model_copy(update={"api_key_env": API_KEY_ENV})})
