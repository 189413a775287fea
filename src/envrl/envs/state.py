"""One rollout's mutable state: `messages` is always the conversation as the model sees it next, `trace` holds every
model call so far, and after `stop(reason)` the loop makes no further model call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envrl.data.traces import Message, Task, Trace, Turn


@dataclass(eq=False)
class RolloutState:
    task: Task
    prompt: list[Message]
    """The initial messages (system prompt and the task's question)."""
    trace: Trace
    messages: list[Message] = field(default_factory=list)
    env: Any = None
    """The per-rollout tool instance of a tool environment (None otherwise)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Scratch space for an environment's own per-rollout bookkeeping."""
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = list(self.prompt)

    def stop(self, reason: str = "completed", truncated: bool = False) -> None:
        """End the rollout after the current step; `reason` becomes `Trace.stop_reason`."""
        self.stop_reason = reason
        self.trace.stop_reason = reason
        self.trace.is_truncated = truncated

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def completion(self) -> str:
        """The text of the model's last answer ('' before the first)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return message.get("content") or ""
        return ""

    @property
    def last_turn(self) -> Turn | None:
        """The last turn of the current branch: what the next model call may extend."""
        if not self.trace.branches or not self.trace.branches[-1].turns:
            return None
        return self.trace.branches[-1].turns[-1]
