"""One description (`EnvServerLaunch`) and one `start` for an env server, whoever starts it; starting it again on
its address brings back the same server; its config is read from a file, never from flags."""

from __future__ import annotations

from pathlib import Path

from loguru import logger
from pydantic import BaseModel, ConfigDict

from envrl.config import config_to_toml
from envrl.data.layout import env_server_process, process_config_file
from envrl.runtime.atomic import atomic_write_text
from envrl.runtime.process import Child, StartingSidecar, allowed_environ, begin_sidecar
from envrl.runtime.restarts import RestartPolicy
from envrl.serve.config import EnvServerConfig


class EnvServerLaunch(BaseModel):
    """An env server to start: the split and name its log and config go by, and what it runs."""

    model_config = ConfigDict(frozen=True)

    split: str
    name: str
    config: EnvServerConfig
    python: str
    """The interpreter it runs in (the env's `python` or `project`, else the starter's own)."""
    restarts: RestartPolicy
    """How it is restarted when it dies (`rl`: the run's `restarts`; a standalone orchestrator: its `restarts`)."""
    pass_env: list[str] = []
    """Variables of the starter's environment it gets beyond the allow-list (the env's `pass_env`)."""

    @property
    def title(self) -> str:
        """How logs and errors name it: `train env server 'reverse-text'`."""
        return f"{self.split} env server {self.name!r}"

    def config_file(self, output_dir: Path) -> Path:
        """Where its config is written for it: `<output_dir>/configs/envs/<split>/<name>.toml`."""
        return process_config_file(output_dir, env_server_process(self.split, self.name))

    def write_config(self, output_dir: Path) -> Path:
        """Write its config to `config_file(output_dir)`, readable by this user only; the path."""
        path = self.config_file(output_dir)
        atomic_write_text(path, config_to_toml(self.config), private=True)
        return path

    def argv(self, config_file: Path) -> list[str]:
        """Its command, the config read from `config_file`."""
        return [self.python, "-m", "envrl.serve.main", "--config", str(config_file)]

    def allowed_env(self, withheld: frozenset[str] = frozenset()) -> list[str]:
        """Names it may see beyond the allow-list: `pass_env` and its model client's API key variable,
        never one of `withheld` (the inference reload token)."""
        api_key_env = getattr(self.config.client, "api_key_env", None)
        return sorted({*self.pass_env, *([api_key_env] if api_key_env else [])} - withheld)


def begin(
    launch: EnvServerLaunch,
    *,
    argv: list[str],
    log_file: Path,
    environ: dict[str, str] | None = None,
    ready_timeout: float = 120.0,
) -> StartingSidecar:
    """Spawn the server with `argv` (`launch.argv` of its written config; `environ` defaults to its
    allowed environment) without waiting for it: `ready` waits for the address it binds."""
    return begin_sidecar(
        argv,
        name=launch.title,
        log_file=log_file,
        env=environ if environ is not None else allowed_environ(launch.allowed_env()),
        ready_timeout=ready_timeout,
    )


def ready(launch: EnvServerLaunch, starting: StartingSidecar, log_file: Path) -> tuple[Child, str]:
    """Wait until the server `begin` spawned reports the address it bound."""
    address = starting.ready()
    logger.info(f"{launch.title} serving at {address} (log: {log_file})")
    return starting.child, address


def start(
    launch: EnvServerLaunch,
    *,
    argv: list[str],
    log_file: Path,
    environ: dict[str, str] | None = None,
    ready_timeout: float = 120.0,
) -> tuple[Child, str]:
    """Spawn the server and wait until it reports the address it bound (`begin`, then `ready`)."""
    starting = begin(launch, argv=argv, log_file=log_file, environ=environ, ready_timeout=ready_timeout)
    return ready(launch, starting, log_file)
