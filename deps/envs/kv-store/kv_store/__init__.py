"""kv-store: put the requested entries into a key-value store by calling its tools.

Guarantee: the store is a plain class (public methods = tools, one instance per rollout) and the
reward reads only that instance's final state: the share of requested entries present with the
right value, so partly done work earns partial credit.
"""

from __future__ import annotations

import random

from envrl.envs import Message, Rubric, Task, ToolEnvironment

WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "lemon", "mango", "grape", "melon"]
SYSTEM_PROMPT = "You manage a key-value store through tools. Do what the user asks, then call finish."


class StoreTask(Task):
    entries: dict[str, str]


class KeyValueStore:
    """The tools the model sees. `done` ends the episode."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.done = False

    def reset(self, entries: dict[str, str]) -> None:
        self.data = {}
        self.done = False

    def set(self, key: str, value: str) -> str:
        """Store a value under a key, replacing any previous value.

        Args:
            key: The key to write.
            value: The value to store.
        """
        self.data[key] = value
        return "ok"

    def get(self, key: str) -> str:
        """Read the value stored under a key.

        Args:
            key: The key to read.
        """
        if key not in self.data:
            raise KeyError(f"no key {key!r}")
        return self.data[key]

    def delete(self, key: str) -> str:
        """Remove a key and its value.

        Args:
            key: The key to remove.
        """
        self.data.pop(key, None)
        return "ok"

    def finish(self) -> str:
        """Say that the work is done; ends the episode."""
        self.done = True
        return "finished"


def entries_stored(env: KeyValueStore, entries: dict[str, str]) -> float:
    """Share of requested entries present in the final store with the requested value."""
    return sum(env.data.get(k) == v for k, v in entries.items()) / len(entries)


def extra_keys(env: KeyValueStore, entries: dict[str, str]) -> float:
    return float(len(set(env.data) - set(entries)))


class KeyValueEnv(ToolEnvironment):
    def prompt(self, task: Task) -> list[Message]:
        assert isinstance(task, StoreTask)
        wanted = ", ".join(f"{k}={v}" for k, v in task.entries.items())
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Store these entries: {wanted}."},
        ]


def make_tasks(count: int, seed: int, max_entries: int) -> list[StoreTask]:
    rng = random.Random(seed)
    return [
        StoreTask(idx=i, entries={k: str(rng.randint(0, 99)) for k in rng.sample(WORDS, rng.randint(1, max_entries))})
        for i in range(count)
    ]


def load_environment(
    num_train: int = 500, num_eval: int = 50, seed: int = 0, max_entries: int = 3, max_turns: int = 8
) -> KeyValueEnv:
    return KeyValueEnv(
        tool_class=KeyValueStore,
        tasks=lambda: make_tasks(num_train, seed, max_entries),
        eval_tasks=lambda: make_tasks(num_eval, seed + 1, max_entries),
        rubric=Rubric({entries_stored: 1.0, extra_keys: 0.0}),
        max_turns=max_turns,
    )
