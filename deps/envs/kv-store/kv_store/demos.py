"""Demonstrations of kv-store solved by hand, for `rl sft`: one conversation per task, a `set`
call per requested entry and then `finish`, with the tool replies the env would give.

    uv run --no-sync python -m kv_store.demos --out outputs/kv_demos.jsonl --count 2000 --max-entries 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kv_store import KeyValueEnv, StoreTask, load_environment, make_tasks


def demonstration(env: KeyValueEnv, task: StoreTask) -> dict[str, Any]:
    """The conversation of an ideal rollout of `task`, in the `rl sft` data format."""
    messages: list[dict[str, Any]] = list(env.prompt(task))
    calls = [("set", {"key": key, "value": value}) for key, value in task.entries.items()] + [("finish", {})]
    for i, (name, arguments) in enumerate(calls):
        call_id = f"call_{i}"
        function = {"name": name, "arguments": json.dumps(arguments)}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "finished" if name == "finish" else "ok"})
    return {"messages": messages, "tools": env.schemas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=2000, help="conversations (tasks 0..count-1 of the train set)")
    parser.add_argument("--max-entries", type=int, default=3, help="as the env's max_entries")
    parser.add_argument("--seed", type=int, default=0, help="as the env's seed (same tasks as its train set)")
    args = parser.parse_args()
    env = load_environment(num_train=1, num_eval=1, seed=args.seed, max_entries=args.max_entries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for task in make_tasks(args.count, args.seed, args.max_entries):
            f.write(json.dumps(demonstration(env, task)) + "\n")
    print(f"wrote {args.count} demonstrations to {args.out}")


if __name__ == "__main__":
    main()
