"""`verifiers:<taskset-id>`: each rollout is one verifiers episode, its model calls recorded as Turns with exact tokens;
`run_rollout`/`run_group` never raise, and with `sandbox` a host-side tool server needs `tools_on_host = true`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import verifiers
import verifiers.v1 as vf
from loguru import logger
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.utils.loaders import load_environment as load_vf_environment
from verifiers.v1.utils.loaders import load_taskset, resolve_env_config, taskset_config_type

from envrl.data.traces import Error, Span, Task, Timing, Trace, WireTask
from envrl.envs.adapters.verifiers.runtime import Placement, local_runtimes
from envrl.envs.adapters.verifiers.sandbox import EpisodeSandboxes, episode_sandbox
from envrl.envs.environment import Environment
from envrl.envs.runner import append_turn
from envrl.model.client import ModelClient, SamplingArgs
from envrl.proxy.chat import ChatProxy, ProxyLimits, Session
from envrl.runtime.warm.programs import WarmPrograms
from envrl.sandbox import BubblewrapProvider, SandboxConfig

SUPPORTED_VERSION = "0.4."
"""The verifiers minor version this adapter is tested with (deps/envs/verifiers-digits pins it)."""
TESTED_HARNESS = "null"
"""The harness the adapter is tested with: verifiers' plain chat loop (no tools)."""
SANDBOXES_AHEAD = 4
"""With `sandbox` and `warm = true`: sandboxes kept started ahead, each running its harness program warm."""
PROXY_KEY_ENV = "ENVRL_VERIFIERS_PROXY_KEY"
"""An API-key variable nobody sets: the proxy needs no key, and verifiers must not send a Prime key."""


class VerifiersTask(Task):
    """A verifiers task as envrl sees it: its `TaskData` as plain JSON (fields left at their defaults omitted)."""

    data: dict[str, Any]


class VerifiersEnvironment(Environment):
    """Tasks from the verifiers taskset (train) and `eval_taskset` (eval); rollouts are episodes."""

    def __init__(
        self,
        env: vf.Env,
        eval_taskset: vf.Taskset | None = None,
        *,
        warm: bool | int = True,
        sandbox: SandboxConfig | None = None,
        proxy: ProxyLimits | None = None,
        tools_on_host: bool = False,
    ) -> None:
        self.vf_env = env
        self.programs = WarmPrograms() if warm else None
        """Where local programs are forked from (None: a fresh interpreter per rollout)."""
        size = SANDBOXES_AHEAD if warm is True else int(warm)
        sandboxes = None if sandbox is None else EpisodeSandboxes(BubblewrapProvider(), sandbox, size)
        self.placement = Placement(self.programs, sandboxes, tools_on_host)
        """Where episodes run their local programs: in a sandbox each when `sandbox` is set, else warm."""
        self._vf_tasks: dict[str, list[vf.Task]] = {}
        self._vf_sources = {"train": env.taskset, "eval": eval_taskset}
        super().__init__(tasks=lambda: self._load("train"), eval_tasks=lambda: self._load("eval"))
        self.proxy = ChatProxy(proxy)
        self._holder: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    def _load(self, split: str) -> list[VerifiersTask]:
        source = self._vf_sources[split]
        tasks = [] if source is None else list(source)
        self._vf_tasks[split] = tasks
        return [
            VerifiersTask(idx=i, data=t.data.model_dump(mode="json", exclude_defaults=True))
            for i, t in enumerate(tasks)
        ]

    def _vf_task(self, task: Task) -> vf.Task:
        for split, tasks in self._vf_tasks.items():
            if 0 <= task.idx < len(tasks) and self.task_list(split)[task.idx] is task:  # type: ignore[arg-type]
                return tasks[task.idx]
        raise ValueError(f"{self.env_id}: task {task.idx} is not one of this environment's tasks")

    # -- running -----------------------------------------------------------------------------

    async def rollout(self, task: Task, client: ModelClient, sampling: SamplingArgs) -> Trace:
        """One episode; verifiers scores inside its episode, so the score is dropped here."""
        trace = await self.run_rollout(task, client, sampling)
        return trace.model_copy(update={"reward": None, "metrics": {}})

    async def run_group(
        self, task: Task, client: ModelClient, sampling: SamplingArgs, n: int, *, scoring_timeout: float | None = None
    ) -> list[Trace]:
        """`n` independent episodes, each scored by verifiers (its own `agent.timeout.scoring`
        bounds scoring; verifiers couples agents within an episode, not across episodes); with a
        seed, episode i samples with seed + i, like native envs."""
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(n)]
        seeded = [sampling.model_copy(update={"seed": seed}) for seed in seeds]
        return list(await asyncio.gather(*(self._episode(task, client, args) for args in seeded)))

    async def _episode(self, task: Task, client: ModelClient, sampling: SamplingArgs) -> Trace:
        wire = WireTask.model_validate(task.model_dump())
        opened: list[str] = []
        start = time.time()
        try:
            vf_task = self._vf_task(task)
            await self._serve()
            ctx = vf.ModelContext(
                model=_model_name(client),
                client=vf.EvalClientConfig(base_url=self.proxy.base_url, api_key_var=PROXY_KEY_ENV),
                sampling=vf.SamplingConfig(max_tokens=sampling.max_tokens, temperature=sampling.temperature),
            )

            def minted(trace: vf.Trace) -> None:
                opened.append(trace.id)
                self.proxy.open(trace.id, client, sampling)

            (slot,) = self.vf_env.slots(vf_task)
            with local_runtimes(self.placement):
                episode = await self.vf_env.run_slot(slot, ctx, on_trace=minted)
            sessions = {sid: self.proxy.sessions[sid] for sid in opened if sid in self.proxy.sessions}
            trace = _to_trace(wire, episode, sessions)
        except Exception as e:  # noqa: BLE001 - never raise: the failure is the trace's error
            logger.opt(exception=e).warning(f"verifiers episode of task {task.idx} failed: {type(e).__name__}: {e}")
            trace = Trace.from_error(wire, Error.from_exception(e))
        finally:
            for session_id in opened:
                self.proxy.close(session_id)
        trace.timing = Timing(generation=Span(start=start, end=time.time()))
        return trace

    async def _serve(self) -> None:
        """Start the proxy and verifiers' serving resources once, in this worker's event loop.

        A task holds them open: when the loop ends (the worker exits) it is cancelled like any
        task, so they close in order instead of as an abandoned async generator."""
        if self._holder is None:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._holder = asyncio.create_task(self._hold(ready))
            self._ready = ready
        await asyncio.shield(self._ready)  # type: ignore[arg-type]

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            await self.proxy.start()
            async with self.vf_env.serving():
                ready.set_result(None)
                await asyncio.Event().wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError("verifiers serving stopped"))
            raise
        finally:
            await self.proxy.stop()
            if self.programs is not None:
                await self.programs.aclose()
            if self.placement.sandboxes is not None:
                await self.placement.sandboxes.aclose()

    async def aclose(self) -> None:
        """Stop verifiers' serving resources and the proxy (an env worker's loop does it on exit)."""
        if self._holder is not None:
            holder, self._holder = self._holder, None
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder


def _model_name(client: ModelClient) -> str:
    config = getattr(client, "config", None)
    return getattr(config, "model", None) or "envrl"


def _to_trace(task: WireTask, episode: vf.Episode, sessions: dict[str, Session]) -> Trace:
    """The envrl Trace of a finished episode: every agent's recorded turns, verifiers' reward."""
    trace = Trace(task=task)
    for vf_trace in episode.traces:
        session = sessions.get(vf_trace.id)
        for turn in session.turns if session else []:
            append_turn(trace, turn)
    trainable = [t for t in episode.traces if t.agent.trainable] or list(episode.traces)
    for vf_trace in trainable:
        trace.metrics |= {k: float(v) for k, v in vf_trace.metrics.items() if v is not None}
        trace.metrics |= {k: float(r.score) for k, r in vf_trace.rewards.items() if r is not None}
    refused = sum(s.refused for s in sessions.values())
    if refused:
        trace.metrics["proxy_refused"] = float(refused)
    trace.is_truncated = any(t.is_truncated for t in trainable)
    stops = [t.stop_condition for t in trainable if t.stop_condition]
    trace.stop_reason = stops[0] if stops else "completed"
    if any(s.context_exhausted for s in sessions.values()):
        trace.stop_reason, trace.is_truncated = "context_length", True
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if errors or not episode.ok:
        failures = [s.failure for s in sessions.values() if s.failure]
        first = errors[0] if errors else None
        message = first.message if first else "verifiers marked the episode as not ok"
        if failures:
            message += f" (chat proxy: {failures[-1]})"
        trace.error = Error(type=first.type if first else "episode_not_ok", message=message, traceback=_tb(first))
        trace.reward, trace.stop_reason = None, "error"
        return trace
    trace.reward = sum(t.reward for t in trainable) / len(trainable)
    return trace


def _tb(error: vf.Error | None) -> str | None:
    return error.traceback if error is not None else None


def _env_config(taskset_id: str, config: dict[str, Any]) -> vf.EnvConfig:
    """The verifiers env config: `config` with the taskset id, and every agent whose runtime is
    not set runs its harness in the local `subprocess` runtime (no remote sandbox)."""
    taskset = {**config.get("taskset", {}), "id": taskset_id}
    resolved = resolve_env_config({**config, "taskset": taskset})
    for name, spec in agent_config_fields(resolved).items():
        if "runtime" not in spec.model_fields_set:
            setattr(resolved, name, spec.model_copy(update={"runtime": vf.SubprocessConfig()}))
    return resolved


def load_environment(
    taskset_id: str,
    eval_taskset: dict[str, Any] | None = None,
    warm: bool | int = True,
    sandbox: dict[str, Any] | None = None,
    proxy: dict[str, Any] | None = None,
    tools_on_host: bool = False,
    **config: Any,
) -> Environment:
    """`verifiers:<taskset-id>` with env args = verifiers' env config (`taskset`, `agent`, ...).

    `eval_taskset`: taskset keys (over `taskset`'s) whose tasks form the eval split (none if unset).
    `warm`: fork the local `subprocess` runtime's harness programs from a warm interpreter per
    program (default); false starts a fresh interpreter per rollout, as verifiers itself does.
    `sandbox`: run each episode's agent runtime (its harness program and what that runs) in an
    envrl sandbox of this config (a `SandboxConfig` as a dict, `{}` for the defaults) instead;
    `warm` then keeps that many sandboxes (true: `SANDBOXES_AHEAD`) started ahead, each with its
    harness program imported by a warm server inside. Tool servers still run on the host (as
    the worker's user), so an env with any is refused with a sandbox unless `tools_on_host`.
    `proxy`: what one episode's model calls may cost the worker (a `ProxyLimits` as a dict).
    """
    if not verifiers.__version__.startswith(SUPPORTED_VERSION):
        raise RuntimeError(
            f"verifiers {verifiers.__version__} is installed, but the envrl adapter is tested with "
            f"{SUPPORTED_VERSION}x only: pin `verifiers>=0.4,<0.5` in the environment's project"
        )
    env_config = _env_config(taskset_id, config)
    for role, harness in env_config.agent_harnesses().items():
        if harness.id != TESTED_HARNESS:
            logger.warning(
                f"verifiers:{taskset_id}: agent {role!r} runs harness {harness.id!r}; envrl is tested with "
                f"{TESTED_HARNESS!r} only, and its train client returns tool calls as text (docs/adapters.md)"
            )
    env = load_vf_environment(env_config)
    evals = None
    if eval_taskset is not None:
        data = {**config.get("taskset", {}), **eval_taskset, "id": taskset_id}
        evals = load_taskset(taskset_config_type(taskset_id).model_validate(data))
    boxed = episode_sandbox(sandbox) if sandbox is not None else None
    if boxed is not None and not tools_on_host and (servers := _host_tool_servers(env)):
        raise ValueError(
            f"verifiers:{taskset_id}: its tool servers ({', '.join(servers)}) would run on the host as the worker's "
            "user while episodes run sandboxed; set `tools_on_host = true` in the env's args to allow that"
        )
    limits = ProxyLimits.model_validate(proxy) if proxy is not None else None
    return VerifiersEnvironment(env, evals, warm=warm, sandbox=boxed, proxy=limits, tools_on_host=tools_on_host)


def _host_tool_servers(env: vf.Env) -> list[str]:
    """The names of the tool servers verifiers would start for `env`'s episodes in runtimes of
    their own (a server `colocated` with the harness runs in the episode's runtime instead)."""
    taskset = env.taskset
    servers = [*type(taskset).task_type().toolsets(taskset.config.task), *taskset.toolsets(taskset.config)]
    return [str(s.server_name) for s in servers if not getattr(s.config, "colocated", False)]
