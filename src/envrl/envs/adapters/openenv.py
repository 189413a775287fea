"""OpenEnv servers as envs: a rollout opens at most one WebSocket session and always closes it; a full server makes it
wait, a failed one makes it an error Trace; a server given as `app` answers only this env server's token."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import random
import secrets
import socket
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from envrl.data.traces import Message, Task
from envrl.envs.environment import Environment, TaskSource
from envrl.envs.rubric import Rubric
from envrl.envs.state import RolloutState
from envrl.runtime.bearer_guard import BearerGuard
from envrl.runtime.process import Child, report_ready, spawn_sidecar

CAPACITY_REACHED = "CAPACITY_REACHED"
CLOSE_TIMEOUT = 5.0
"""Seconds a session's close may take before the socket is dropped (the server frees it either way)."""
START_TIMEOUT = 300.0
"""Seconds an `app` server may take to start (openenv-core's imports alone are slow: docs/measurements.md)."""
MAX_CAPACITY_POLL = 0.25
"""Longest wait between two tries for a session of a server at capacity (seconds, jittered ±50%)."""
URL_ENV_PREFIX = "ENVRL_OPENENV_URL_"
"""Where an env server publishes the URL of the OpenEnv server it started, for its workers."""
TOKEN_ENV_PREFIX = "ENVRL_OPENENV_TOKEN_"
"""Beside it, the token that server demands (environment only: never argv, a file or a log)."""
TOKEN_ENV = "ENVRL_OPENENV_TOKEN"
"""How the OpenEnv server's process gets its token (it removes it before loading the app)."""


class OpenEnvTask(Task):
    """The default task: the keyword arguments of `reset` (a seed)."""

    seed: int


class OpenEnvError(RuntimeError):
    """The OpenEnv server answered an error, or the session broke; `code` is its `WSErrorCode`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class StepResult:
    """One reset or step answer: the observation's own fields, its reward and whether it is done."""

    observation: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


class OpenEnvSession:
    """One WebSocket session with an OpenEnv server (`/ws`): one environment instance there."""

    def __init__(self, url: str, message_timeout: float, token: str | None = None) -> None:
        self.url = url
        self.message_timeout = message_timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        self._ws: ClientConnection | None = None

    async def connect(self, timeout: float) -> None:
        try:
            self._ws = await connect(
                self.url,
                additional_headers=self._headers,
                open_timeout=timeout,
                close_timeout=CLOSE_TIMEOUT,
                max_size=None,
            )
        except (OSError, TimeoutError, WebSocketException) as e:
            raise OpenEnvError(f"cannot connect to the OpenEnv server at {self.url}: {e}", "CONNECT") from e

    async def request(self, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._ws is not None, "connect() first"
        message = {"type": kind} if data is None else {"type": kind, "data": data}
        try:
            with suppress(ConnectionClosed):  # a server at capacity says so and closes at once: read why below
                await self._ws.send(json.dumps(message))
            answer = json.loads(await asyncio.wait_for(self._ws.recv(), self.message_timeout))
        except ConnectionClosed as e:
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} closed the session during {kind!r} ({e}); did it crash?", "CLOSED"
            ) from e
        except TimeoutError as e:
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} did not answer {kind!r} within {self.message_timeout:g} s "
                "(message_timeout)",
                "TIMEOUT",
            ) from e
        if answer.get("type") == "error":
            error = answer.get("data") or {}
            code = str(error.get("code", "UNKNOWN"))
            raise OpenEnvError(f"OpenEnv server at {self.url}: {kind!r} failed: {error.get('message')} ({code})", code)
        return answer.get("data") or {}

    async def result(self, kind: str, data: dict[str, Any]) -> StepResult:
        payload = await self.request(kind, data)
        reward = payload.get("reward")
        return StepResult(
            observation=dict(payload.get("observation") or {}),
            reward=None if reward is None else float(reward),
            done=bool(payload.get("done", False)),
            metadata=dict(payload.get("metadata") or {}),
        )

    async def close(self) -> None:
        """Say `close` and let the server close the socket (it frees the session either way).

        Closing first from this side makes openenv-core 0.3.0 log a traceback per session (its
        own `websocket.close()` then finds the socket gone), so this waits for the server's close.
        """
        ws, self._ws = self._ws, None
        if ws is None:
            return
        # Any step may fail on a dead server; there is nothing left to free then.
        with suppress(Exception):
            await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), CLOSE_TIMEOUT)
            await asyncio.wait_for(ws.wait_closed(), CLOSE_TIMEOUT)
        with suppress(Exception):
            await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT)


ObservationToMessages = Callable[[dict[str, Any]], "list[Message] | str"]
"""An observation's fields (reward, done and metadata removed) -> the messages the model sees next
(a string is one user message)."""
CompletionToAction = Callable[[str], dict[str, Any]]
"""The model's answer text -> the action's fields."""


class OpenEnvEnvironment(Environment):
    """An OpenEnv server driven over its WebSocket session API; see docs/adapters.md.

    `url` (a running server) or `app` (`module:attribute` of its ASGI app, or `module:factory()`
    for a function that builds it, started by envrl);
    `observation` and `action` are the glue; `reward` is "final" (the last step's reward),
    "steps" (the sum of the step rewards) or an envrl `Rubric` (reward functions may ask for
    `state`; `state.data["steps"]` holds every `StepResult`, the reset's first). Tasks default to
    `num_tasks` seeds (`reset(seed=...)`); `reset_args(task)` maps other tasks to `reset` arguments.
    At the server's capacity a rollout retries (backoff up to `MAX_CAPACITY_POLL`); `max_sessions`
    (the server's `max_concurrent_envs` / the env server's workers) queues them in order instead.
    """

    def __init__(
        self,
        *,
        observation: ObservationToMessages,
        action: CompletionToAction,
        url: str | None = None,
        app: str | None = None,
        reward: Literal["final", "steps"] | Rubric = "final",
        tasks: TaskSource | None = None,
        eval_tasks: TaskSource | None = None,
        num_tasks: int = 1024,
        reset_args: Callable[[Task], dict[str, Any]] | None = None,
        max_turns: int = 1,
        connect_timeout: float = 30.0,
        message_timeout: float = 60.0,
        max_sessions: int | None = None,
        capacity_poll: float = 0.05,
        mcp: bool = False,
        **kwargs: Any,
    ) -> None:
        if (url is None) == (app is None):
            raise ValueError("OpenEnvEnvironment: give exactly one of `url` (a running server) or `app` (module:app)")
        rubric = reward if isinstance(reward, Rubric) else Rubric({_REWARDS[reward]: 1.0})
        super().__init__(
            tasks=tasks if tasks is not None else _seeds(num_tasks, 0),
            eval_tasks=eval_tasks if eval_tasks is not None else _seeds(min(num_tasks, 256), 1_000_000),
            rubric=rubric,
            max_turns=max_turns,
            stop_on_length=False,  # every completion is an action, also one cut off by max_tokens
            **kwargs,
        )
        http, self.token = (url, None) if url is not None else _served(app)  # type: ignore[arg-type]
        self.url = http.replace("http://", "ws://", 1).replace("https://", "wss://", 1).rstrip("/") + "/ws"
        self.observation_to_messages = observation
        self.completion_to_action = action
        self.reset_args = reset_args or (lambda task: task.model_dump(exclude={"idx"}))
        self.connect_timeout = connect_timeout
        self.message_timeout = message_timeout
        self.capacity_poll = capacity_poll
        self.sessions = None if max_sessions is None else asyncio.Semaphore(max_sessions)
        """This process's sessions at once: beyond it rollouts wait here, in order, instead of polling."""
        self.mcp = mcp

    def prompt(self, task: Task) -> list[Message]:
        """The system prompt only: the first observation comes from `reset` (in `setup`)."""
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    async def setup(self, state: RolloutState) -> None:
        start = time.monotonic()
        if self.sessions is not None:
            await self.sessions.acquire()
            state.data["holds_slot"] = True
        first = await self._open(state, self.reset_args(state.task))
        state.trace.metrics["openenv_wait_s"] = time.monotonic() - start
        state.data["steps"] = [first]
        if self.mcp:
            listed = await state.data["session"].result("step", {"type": "list_tools"})
            state.data["tools"] = [_openai_tool(tool) for tool in listed.observation.get("tools", [])]
        messages = self._messages(first)
        state.prompt.extend(messages)
        state.messages.extend(messages)
        if first.done:
            state.stop("completed")

    async def _open(self, state: RolloutState, args: dict[str, Any]) -> StepResult:
        """A session reset with `args`; at capacity, retried (with jittered backoff) until one is free."""
        delay = self.capacity_poll
        while True:
            session = OpenEnvSession(self.url, self.message_timeout, self.token)
            state.data["session"] = session
            await session.connect(self.connect_timeout)
            try:
                return await session.result("reset", args)
            except OpenEnvError as e:
                if e.code != CAPACITY_REACHED:
                    raise
            await session.close()
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, MAX_CAPACITY_POLL)

    def tools(self, state: RolloutState) -> list[dict[str, Any]] | None:
        """The MCP server's tools (listed after `reset`); None without `mcp`."""
        return state.data.get("tools") or None

    async def env_response(self, state: RolloutState) -> list[Message]:
        last = state.last_turn
        calls = (last.response.get("tool_calls") or []) if self.mcp and last is not None else []
        if calls:
            return [await self._call_tool(state, call) for call in calls]
        action = self.completion_to_action(state.completion)
        result = await state.data["session"].result("step", action)
        state.data["steps"].append(result)
        if result.done:
            state.stop("completed")
        return self._messages(result)

    async def _call_tool(self, state: RolloutState, call: dict[str, Any]) -> Message:
        """One tool call as a `call_tool` step; a malformed call or a failed tool is the call's
        tool message (the model's doing), a broken session an error Trace (raised)."""
        function = call.get("function") or {}
        arguments = function.get("arguments") or {}
        reply: Message = {"role": "tool", "tool_call_id": call.get("id") or ""}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as e:
                return reply | {"content": f"error: the arguments are not JSON ({e})"}
        action = {"type": "call_tool", "tool_name": function.get("name", ""), "arguments": arguments}
        result = await state.data["session"].result("step", action)
        state.data["steps"].append(result)
        if result.done:
            state.stop("completed")
        error = result.observation.get("error")
        if error:
            return reply | {"content": f"error: {error.get('message', error)}"}
        return reply | {"content": _tool_text(result.observation.get("result"))}

    def _messages(self, result: StepResult) -> list[Message]:
        messages = self.observation_to_messages(result.observation)
        return [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)

    async def cleanup(self, state: RolloutState) -> None:
        session = state.data.pop("session", None)
        try:
            if session is not None:
                await session.close()
        finally:
            if state.data.pop("holds_slot", False) and self.sessions is not None:
                self.sessions.release()


def final_reward(state: RolloutState) -> float | None:
    """The last step's reward (None, not applicable, before any step or when the server gave none)."""
    steps = state.data.get("steps", [])
    return steps[-1].reward if len(steps) > 1 else None


def step_rewards(state: RolloutState) -> float | None:
    """The sum of the step rewards the server gave (None if it gave none)."""
    rewards = [s.reward for s in state.data.get("steps", [])[1:] if s.reward is not None]
    return sum(rewards) if rewards else None


_REWARDS = {"final": final_reward, "steps": step_rewards}


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool listing (name, description, input_schema) as an OpenAI function tool."""
    schema = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    function = {"name": tool["name"], "description": tool.get("description") or "", "parameters": schema}
    return {"type": "function", "function": function}


def _tool_text(result: Any) -> str:
    """A tool result as text: an MCP result's text contents joined, anything else as JSON."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, dict) and c.get("type") == "text"]
        if texts:
            return "\n".join(texts)
        if result.get("structured_content") is not None:
            return json.dumps(result["structured_content"])
    return result if isinstance(result, str) else json.dumps(result)


def _seeds(count: int, base: int) -> Callable[[], list[Task]]:
    return lambda: [OpenEnvTask(idx=i, seed=base + i) for i in range(count)]


_children: list[Child] = []
"""OpenEnv servers this process started (they die with it)."""


def _served(app: str) -> tuple[str, str]:
    """The URL of this env server's child serving `app` and the token it demands: started here
    once, both inherited by the workers."""
    name = hashlib.sha1(app.encode()).hexdigest()[:12]
    key, token_key = URL_ENV_PREFIX + name, TOKEN_ENV_PREFIX + name
    if key not in os.environ:
        token = secrets.token_urlsafe(32)
        argv = [
            sys.executable,
            "-m",
            "envrl.runtime.guarded",
            "envrl.envs.adapters.openenv",
            app,
        ]  # dies with us from its 1st line
        env = {**os.environ, TOKEN_ENV: token}
        child, url = spawn_sidecar(argv, name=f"OpenEnv server {app}", env=env, ready_timeout=START_TIMEOUT)
        _children.append(child)
        os.environ[key], os.environ[token_key] = url, token
    return os.environ[key], os.environ[token_key]


def load_app(app_spec: str) -> Any:
    """The ASGI app `module:attribute` names (`module` alone: its `app`), or, for
    `module:factory()`, what calling the factory with no arguments returns (servers written as
    `create_app(...)` inside a function)."""
    module_name, _, attribute = app_spec.partition(":")
    attribute = attribute or "app"
    module = importlib.import_module(module_name)
    factory = attribute.endswith("()")
    name = attribute.removesuffix("()")
    if not hasattr(module, name):
        raise ValueError(f"OpenEnv app {app_spec!r}: module {module_name!r} has no attribute {name!r}")
    target = getattr(module, name)
    return target() if factory else target


def serve(app_spec: str) -> None:
    """Child side: serve `module:attribute` with uvicorn on a free loopback port, report its URL."""
    import uvicorn  # installed with openenv-core

    token = os.environ.pop(TOKEN_ENV)  # before the app is loaded: neither it nor its children see it
    app = BearerGuard(load_app(app_spec), token, refusal=b"this OpenEnv server serves its env server only")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made once the URL is reported wait in the backlog until uvicorn runs
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    report_ready(f"http://127.0.0.1:{sock.getsockname()[1]}")
    server.run(sockets=[sock])


if __name__ == "__main__":
    serve(sys.argv[1])
