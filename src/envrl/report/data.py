"""What the report reads: only files the run publishes, each through its owner's reader; a line cut by a crash is
skipped, and every sample of a batch is attached to exactly the one rollout it was made from."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel

from envrl.data.layout import (
    batch_dir,
    eval_results_root,
    eval_rollouts_files,
    process_config_file,
    published_steps,
    train_rollouts_file,
    weights_dir,
    weights_root,
)
from envrl.data.rollout_lines import parse_trace_line
from envrl.data.samples import BatchError, TrainingSample, read_batch
from envrl.data.traces import Split, Trace


class Rollout(BaseModel):
    """One train rollout of a step as the trace browser shows it."""

    split: Split = "train"
    fields: dict[str, Any]
    """The bookkeeping of its `train.jsonl` line: `step`, `env`, `policy_step`."""
    trace: Trace
    samples: list[TrainingSample] = []
    """The training samples made from it (none for an errored, unscored or dropped rollout)."""

    @property
    def env(self) -> str:
        return str(self.fields.get("env", "?"))


_STEP_PREFIX = re.compile(r'\{"step": (-?\d+),')
"""How every rollouts line starts (`trace_line` writes the bookkeeping fields first): lets a
report group lines by step without parsing the steps it does not rewrite."""


def _lines_by_step(path: Path, by_step: dict[int, list[str]]) -> None:
    """Add the complete lines of a rollouts file (`trace_line`'s) to `by_step`, by their step."""
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # being appended right now
            if match := _STEP_PREFIX.match(line):
                by_step[int(match.group(1))].append(line)
            else:
                logger.warning(f"{path}:{number}: not a rollout line of trace_line's (no leading step); skipped")


def train_lines(output_dir: Path) -> dict[int, list[str]]:
    """The complete `rollouts/train.jsonl` lines of every step, in the order they were written."""
    by_step: dict[int, list[str]] = defaultdict(list)
    path = train_rollouts_file(output_dir)
    if path.exists():
        _lines_by_step(path, by_step)
    return dict(by_step)


def eval_lines(output_dir: Path) -> dict[int, list[str]]:
    """The complete lines of every `rollouts/eval/step_<n>.jsonl`, by step."""
    by_step: dict[int, list[str]] = defaultdict(list)
    for _, path in sorted(eval_rollouts_files(output_dir).items()):
        _lines_by_step(path, by_step)
    return dict(by_step)


def results_lines(output_dir: Path) -> list[str]:
    """The complete lines of an `rl eval` output dir's `eval/<env>.jsonl` files, env by env."""
    lines: list[str] = []
    for path in sorted(eval_results_root(output_dir).glob("*.jsonl")):
        with path.open() as f:
            lines.extend(line for line in f if line.endswith("\n"))  # a cut last line is being written
    return lines


def parse_rollouts(lines: list[str], where: str, split: Split = "train") -> list[Rollout]:
    """The rollouts of `lines` (one step's, from `train_lines` or `eval_lines`); a bad line is
    logged and skipped."""
    rollouts = []
    for line in lines:
        try:
            fields, trace = parse_trace_line(line)
        except ValueError as e:
            logger.warning(f"{where}: a rollout line that is not one ({e}); skipped")
            continue
        rollouts.append(Rollout(fields=fields, trace=trace, split=split))
    return rollouts


def _turn_starts(trace: Trace) -> list[list[int] | None]:
    """What a sample made from this trace can start with, in the order samples are made: each
    turn's prompt and completion, branch by branch (None for a token-less turn: anything)."""
    return [
        turn.tokens.prompt_ids + turn.tokens.completion_ids if turn.tokens is not None else None
        for branch in trace.branches
        for turn in branch.turns
    ]


def _starts_with(ids: list[int], start: list[int] | None) -> bool:
    """`ids` begins with `start` (compared as far as both go: `seq_len` may have cut the sample)."""
    if start is None:
        return True
    n = min(len(start), len(ids))
    return ids[:n] == start[:n]


def attach_samples(rollouts: list[Rollout], samples: list[TrainingSample], where: str) -> None:
    """Give each rollout the samples made from it. The orchestrator makes samples rollout by
    rollout in `train.jsonl` order (turn by turn within one), skipping rollouts that train on
    nothing, so one forward walk pairs them: a sample goes to the first rollout at or after the
    previous sample's whose env, task, policy and a not yet used turn's tokens it starts with.
    A sample no rollout explains is reported and left out."""
    starts = [_turn_starts(r.trace) for r in rollouts]
    used = [0] * len(rollouts)
    i = 0
    for index, sample in enumerate(samples):
        for j in range(i, len(rollouts)):
            rollout = rollouts[j]
            if (sample.env, sample.task_idx, sample.policy_step) != (
                rollout.env,
                rollout.trace.task.idx,
                rollout.fields.get("policy_step"),
            ):
                continue
            k = next((k for k in range(used[j], len(starts[j])) if _starts_with(sample.input_ids, starts[j][k])), None)
            if k is not None:
                rollout.samples.append(sample)
                used[j], i = k + 1, j
                break
        else:
            logger.warning(
                f"{where}: sample {index} (env {sample.env!r}, task {sample.task_idx}) matches no rollout "
                "of train.jsonl at this step; it is left out of the trace browser"
            )


def step_rollouts(output_dir: Path, step: int, rollouts: list[Rollout]) -> list[Rollout]:
    """`rollouts` (one step's, from `parse_rollouts`) with their samples from the batch of
    `step`; without samples while the batch is not published yet."""
    path = batch_dir(output_dir, step)
    if path.is_dir():
        try:
            attach_samples(rollouts, read_batch(path), str(path))
        except BatchError as e:
            logger.warning(f"{e}; step {step} is shown without tokens")
    return rollouts


def tokenizer_source(output_dir: Path) -> str | None:
    """Where the run's tokenizer lives: the newest published weights (they carry it), else the
    model named in the run's orchestrator config."""
    for step in reversed(published_steps(weights_root(output_dir))):
        candidate = weights_dir(output_dir, step)
        if (candidate / "tokenizer_config.json").exists():
            return str(candidate)
    config = process_config_file(output_dir, "orchestrator")
    if config.exists():
        import tomllib

        name = tomllib.loads(config.read_text()).get("model", {}).get("name")
        return str(name) if name else None
    return None


class Detokenizer:
    """Token ids as text, one id at a time (cached): what each coloured token in the page shows.
    A tokenizer.json without clean-up of spaces decodes through the `tokenizers` library itself,
    as transformers' decode does, without importing transformers and torch (seconds at the end of
    every `rl` run); any other tokenizer through transformers."""

    def __init__(self, source: str | None) -> None:
        self._decode: Callable[[list[int]], str] | None = None
        self._cache: dict[int, str] = {}
        if source is not None:
            self._decode = _tokenizers_decode(Path(source)) or _transformers_decode(source)

    def __call__(self, token_id: int) -> str:
        if token_id not in self._cache:
            text = self._decode([token_id]) if self._decode is not None else None
            self._cache[token_id] = text if text else f"<{token_id}>"
        return self._cache[token_id]


def _tokenizers_decode(directory: Path) -> Callable[[list[int]], str] | None:
    """Decoding by `directory`'s tokenizer.json, special tokens kept (transformers' default), or
    None where transformers would do more (clean-up of spaces) or the file is missing or bad."""
    file, config = directory / "tokenizer.json", directory / "tokenizer_config.json"
    try:
        if not file.is_file() or (
            config.is_file() and json.loads(config.read_text()).get("clean_up_tokenization_spaces")
        ):
            return None
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(file))
    except Exception:  # transformers then loads it, or says why it cannot
        return None
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False))


def _transformers_decode(source: str) -> Callable[[list[int]], str] | None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        logger.warning(f"tokenizer at {source} could not be loaded ({e}); tokens are shown as ids")
        return None
    return lambda ids: str(tokenizer.decode(ids))
