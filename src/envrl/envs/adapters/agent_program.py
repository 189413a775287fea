"""Black-box agent programs as envs: one run per rollout, its model calls recorded as Turns with exact tokens via a
proxy session of its own; a failed, late or cancelled program is killed with its group: an error Trace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
from collections.abc import Mapping, Sequence

from envrl.data.traces import Message, Task
from envrl.envs.environment import Environment, TaskSource
from envrl.envs.rubric import Rubric
from envrl.envs.runner import append_turn
from envrl.envs.state import RolloutState
from envrl.model.client import ModelClient, SamplingArgs
from envrl.proxy.chat import ChatProxy, ProxyLimits
from envrl.sandbox import BubblewrapProvider, Sandbox, SandboxConfig, SandboxProvider, WarmPool

PASSED_THROUGH = ("PATH", "HOME", "LANG", "VIRTUAL_ENV")
"""The worker's variables a program gets (to find its interpreter and a locale), and no others."""
STDERR_TAIL_BYTES = 2000
"""How much of a failed program's stderr its error Trace shows."""


class AgentProgramError(RuntimeError):
    """The agent program failed; `error_type` names how (the error Trace's type)."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class AgentProgramEnvironment(Environment):
    """Rollouts of `command` over `tasks`; reward functions take `answer` (the program's stdout)."""

    def __init__(
        self,
        *,
        command: Sequence[str],
        tasks: TaskSource,
        eval_tasks: TaskSource = (),
        rubric: Rubric | None = None,
        timeout_s: float = 300.0,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int = 1 << 20,
        sandbox: SandboxConfig | None = None,
        files: Mapping[str, str | bytes] | None = None,
        warm: int = 0,
        provider: SandboxProvider | None = None,
        proxy: ProxyLimits | None = None,
    ) -> None:
        """`sandbox`: run each rollout's program in a sandbox of this config (`command` then names
        paths inside it: its image, or `files`, written to its workdir before the program starts);
        `warm` keeps that many sandboxes started ahead; `provider` replaces the local bubblewrap
        one. The program's stdout is then limited by `sandbox.limits.max_output_kib` too. `proxy`: what
        one rollout's model calls may cost (body size, calls, bytes; defaults otherwise)."""
        super().__init__(tasks=tasks, eval_tasks=eval_tasks, rubric=rubric)
        if not command:
            raise ValueError("command must name the agent program to run, e.g. ['python', 'my_agent.py']")
        if files and sandbox is None:
            raise ValueError("files are written into the program's sandbox: give `sandbox` too")
        self.command = list(command)
        self.timeout_s = timeout_s
        self.extra_env = dict(env or {})
        self.max_output_bytes = max_output_bytes
        self.sandbox = sandbox
        self.files = dict(files or {})
        self._provider = provider
        self._warm = warm
        self.proxy = ChatProxy(proxy)
        self._proxy_started: asyncio.Lock | None = None

    def prompt(self, task: Task) -> list[Message]:
        """None: the program writes its own prompts (each recorded turn holds the one it sent)."""
        return []

    async def episode(self, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
        await self._start_proxy()
        session_id = secrets.token_hex(16)
        session = self.proxy.open(session_id, client, sampling)
        try:
            if self.sandbox is None:
                answer = await self._run(state, session_id, client)
            else:
                answer = await self._run_sandboxed(state, self.sandbox, session_id, client)
        finally:
            self.proxy.close(session_id)
            for turn in session.turns:
                append_turn(state.trace, turn)
            if session.refused:
                state.trace.metrics["proxy_refused"] = float(session.refused)
        if session.failure and not session.turns:
            raise AgentProgramError(f"the program made no model call that succeeded ({session.failure})", "agent_model")
        state.data["answer"] = answer
        if session.context_exhausted:
            state.stop("context_length", truncated=True)
        else:
            state.stop("completed")

    async def _start_proxy(self) -> None:
        if self._proxy_started is None:
            self._proxy_started = asyncio.Lock()
        async with self._proxy_started:
            if not self.proxy.base_url:
                await self.proxy.start()

    async def _run(self, state: RolloutState, session_id: str, client: ModelClient) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._environ(session_id, client),
            start_new_session=True,
        )
        task = json.dumps(state.task.model_dump(mode="json")).encode()
        try:
            stdout, stderr = await asyncio.wait_for(self._talk(proc, task), self.timeout_s)
        except TimeoutError:
            raise AgentProgramError(
                f"{self.command[0]} ran past timeout_s = {self.timeout_s:g} s and was killed", "agent_timeout"
            ) from None
        finally:
            _kill_group(proc)
            await proc.wait()
        if proc.returncode != 0:
            tail = stderr[-STDERR_TAIL_BYTES:].decode(errors="replace")
            raise AgentProgramError(
                f"{self.command[0]} exited with {proc.returncode}; stderr ends:\n{tail}", "agent_exit"
            )
        return stdout.decode(errors="replace").strip()

    async def _run_sandboxed(
        self, state: RolloutState, config: SandboxConfig, session_id: str, client: ModelClient
    ) -> str:
        box = await self._sandboxes(config).create(config)
        try:
            return await self._in_sandbox(box, state, session_id, client)
        finally:
            await asyncio.shield(box.close())

    async def _in_sandbox(self, box: Sandbox, state: RolloutState, session_id: str, client: ModelClient) -> str:
        await box.forward_host_ports([self.proxy.port])
        for path, data in self.files.items():
            await box.write_file(path, data)
        environ = self._session_env(session_id, client)
        task = json.dumps(state.task.model_dump(mode="json"))
        result = await box.run(self.command, stdin=task, timeout=self.timeout_s, env=environ)
        if result.timed_out:
            raise AgentProgramError(
                f"{self.command[0]} ran past timeout_s = {self.timeout_s:g} s in its sandbox and was killed",
                "agent_timeout",
            )
        if result.exit_code != 0:
            tail = result.stderr[-STDERR_TAIL_BYTES:]
            raise AgentProgramError(
                f"{self.command[0]} exited with {result.exit_code} in its sandbox; stderr ends:\n{tail}", "agent_exit"
            )
        return result.stdout[: self.max_output_bytes].strip()

    def _sandboxes(self, config: SandboxConfig) -> SandboxProvider:
        """The provider, made on first use (a warm pool starts sandboxes on this worker's loop)."""
        if self._provider is None:
            self._provider = BubblewrapProvider()
            if self._warm:
                self._provider = WarmPool(self._provider, config, size=self._warm)
        return self._provider

    async def _talk(self, proc: asyncio.subprocess.Process, task: bytes) -> tuple[bytes, bytes]:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a program that ignores its task
            proc.stdin.write(task)
            await proc.stdin.drain()
            proc.stdin.close()
        stdout, stderr = await asyncio.gather(
            _read_bounded(proc.stdout, self.max_output_bytes), _read_bounded(proc.stderr, self.max_output_bytes)
        )
        await proc.wait()
        return stdout, stderr

    def _environ(self, session_id: str, client: ModelClient) -> dict[str, str]:
        """A program on the host: the few worker variables it needs, then the session's."""
        environ = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        return environ | self._session_env(session_id, client)

    def _session_env(self, session_id: str, client: ModelClient) -> dict[str, str]:
        config = getattr(client, "config", None)
        return {
            "OPENAI_BASE_URL": self.proxy.session_url(session_id),
            "OPENAI_API_KEY": "envrl-session",
            "OPENAI_MODEL": getattr(config, "model", None) or "envrl",
            **self.extra_env,
        }

    async def cleanup(self, state: RolloutState) -> None:
        """Nothing per rollout: the program and its session are gone when `episode` returns."""

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()
        await self.proxy.stop()


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Up to `limit` bytes of `stream`; the rest is read and dropped, so the program never blocks."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
