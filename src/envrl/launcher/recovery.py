"""A restarted role runs its first start's command (trainer and orchestrator with `--resume`) and counts as back
once it has made up for its death (a newer policy or batch published, a replica serving the newest policy, the
teacher answering); another user's listener on a server's port at any poll ends the run before a secret goes there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
from loguru import logger

from envrl.data.layout import published_steps, rollouts_root, weights_dir, weights_root
from envrl.launcher.plan.commands import Command
from envrl.model.inference import InferenceClient, InferenceError
from envrl.runtime.http import HttpCallError
from envrl.runtime.listeners import ForeignListener, foreign_listeners_at, squatter_error
from envrl.runtime.process import Child, ChildFailed
from envrl.runtime.restarts import RestartPolicy
from envrl.runtime.supervisor import Check, Respawn

RESUME_FLAG = "--resume"


def resumed(command: Command) -> Command:
    """`command` continuing what its earlier start published (`--resume` added once)."""
    if RESUME_FLAG in command.argv:
        return command
    return command.model_copy(update={"argv": [*command.argv, RESUME_FLAG]})


def published_past(root: Path) -> Callable[[], Check]:
    """At a death: a check that passes once `root` holds a `step_<n>` newer than it holds now."""

    def at_death() -> Check:
        steps = published_steps(root)
        newest = steps[-1] if steps else -1

        def back() -> bool:
            steps = published_steps(root)
            return bool(steps) and steps[-1] > newest

        return back

    return at_death


def trainer_respawn(command: Command, start: Callable[[Command], Child], policy: RestartPolicy, out: Path) -> Respawn:
    return Respawn(lambda: start(resumed(command)), policy, back=published_past(weights_root(out)))


def orchestrator_respawn(
    command: Command, start: Callable[[Command], Child], policy: RestartPolicy, out: Path
) -> Respawn:
    return Respawn(lambda: start(resumed(command)), policy, back=published_past(rollouts_root(out)))


def replica_respawn(
    command: Command,
    start: Callable[[Command], Child],
    policy: RestartPolicy,
    base_url: str,
    model: str,
    out: Path,
    token: str | None,
) -> Respawn:
    return Respawn(
        lambda: start(on_newest_policy(command, model, out)),
        policy,
        back=lambda: ReplicaBack(base_url, model, out, token),
    )


def on_newest_policy(command: Command, model: str, out: Path) -> Command:
    """The replica's command loading the newest published policy instead of the base model, under
    the base model's name (which its callers send): no call it answers comes from an older policy
    (the policy it serves may run ahead of the orchestrator's by the steps published meanwhile, never
    past a batch's own step). The first start, with nothing published, is the command itself."""
    steps = _file_policies(out)  # a policy sent in memory cannot be loaded again: its sender moved on
    if not steps:
        return command
    newest = str(weights_dir(out, steps[-1]).resolve())
    argv = [*command.argv, "--model.name", newest, "--vllm.served-model-name", model]
    return command.model_copy(update={"argv": argv})


def teacher_respawn(
    command: Command, start: Callable[[Command], Child], policy: RestartPolicy, base_url: str
) -> Respawn:
    """The distillation teacher's server comes back like a replica on fixed weights: `ServerBack`."""
    return Respawn(lambda: start(command), policy, back=lambda: ServerBack(base_url))


class ServerBack:
    """The check of a restarted server of the run: back once `/health` answers 200 (and `serving`
    holds). At every poll, before anything is asked, another local user listening on its port (it
    took the port while the server was dead; whatever it answers) ends the run (ChildFailed)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def __call__(self) -> bool:
        if foreign := foreign_listeners_at(self.base_url):
            raise ChildFailed(f"{self.base_url}: {squatter_error(self.base_url, foreign)}")
        try:
            if httpx.get(f"{self.base_url}/health", timeout=2.0, trust_env=False).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
        return self.serving()

    def serving(self) -> bool:
        return True


class ReplicaBack(ServerBack):
    """A restarted replica (`ServerBack`) serves once the newest published policy is loaded into
    it (again while a newer one appeared meanwhile); the reload client checks the listener too."""

    def __init__(self, base_url: str, model: str, output_dir: Path, token: str | None) -> None:
        super().__init__(base_url)
        self.model = model
        self.output_dir = output_dir
        self.token = token

    def serving(self) -> bool:
        loaded = None
        while (steps := _file_policies(self.output_dir)) and steps[-1] != loaded:
            loaded = steps[-1]
            try:
                asyncio.run(self._load(loaded))
            except ForeignListener as e:
                raise ChildFailed(f"inference replica: {e}") from None
            except (HttpCallError, InferenceError) as e:
                logger.warning(f"inference at {self.base_url} is up again, but loading policy {loaded} failed: {e}")
                return False
            logger.info(f"inference at {self.base_url} serves policy {loaded} again")
        return True

    async def _load(self, step: int) -> None:
        """Serve policy `step` (nothing to do when the replica started on it)."""
        path = weights_dir(self.output_dir, step)
        client = InferenceClient(self.base_url, self.model, reload_token=self.token)
        try:
            if await client.served_weights() != str(path.resolve()):
                await client.update_weights(path, step=step)
        finally:
            await client.aclose()


def _file_policies(output_dir: Path) -> list[int]:
    """`transport.weights.file_policies`, imported when a replica comes back rather than at `rl`'s
    start: that module imports torch (~2 s), which every `rl` command would otherwise pay first."""
    from envrl.transport.weights import file_policies

    return file_policies(output_dir)
