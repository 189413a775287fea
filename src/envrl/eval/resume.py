"""An earlier `rl eval`'s results: refused unless resumed, and when resumed, read back as the
successful rollouts to keep (the later line of a pair wins) and how often each pair ran."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from loguru import logger

from envrl.data.layout import eval_results_root
from envrl.data.rollout_lines import parse_trace_line
from envrl.data.traces import Trace
from envrl.envclient.eval_grid import Pair
from envrl.eval.config import EvalCommandConfig, EvalInputError


def check_earlier_results(config: EvalCommandConfig, envs: Iterable[str]) -> None:
    """Refuse to mix the results of `envs` with an earlier eval's unless resuming it."""
    if config.resume is not None and not eval_results_root(config.resume).is_dir():
        raise EvalInputError(
            f"--resume {config.resume}: no earlier eval there ({eval_results_root(config.resume)} does not exist)"
        )
    if config.resume is None:
        for env in envs:
            if config.results_file(env).exists():
                raise EvalInputError(
                    f"{config.results_file(env)} holds an earlier eval; complete it with --resume {config.output_dir} "
                    "or pick a new --output-dir"
                )


def read_earlier(path: Path, name: str, n: int, r: int) -> tuple[dict[Pair, Trace], Counter[Pair]]:
    """The successful rollouts in `path`, the earlier results of env `name` on `n` tasks x `r`
    rollouts (the later line of a pair wins), and how often each pair ran."""
    attempts: Counter[Pair] = Counter()
    if not path.exists():
        logger.info(f"env {name!r}: no earlier results in {path}; running all {n * r} rollouts")
        return {}, attempts
    latest: dict[Pair, Trace] = {}
    unreadable = 0
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        try:
            fields, trace = parse_trace_line(line)
            pair = (trace.task.idx, fields["rollout"])
            if fields.get("env") != name or not isinstance(pair[1], int):
                raise ValueError(f"not a rollout line of env {name!r} (env {fields.get('env')!r}, rollout {pair[1]!r})")
        except (ValueError, KeyError) as e:
            unreadable += 1
            logger.warning(f"{path}:{lineno}: skipped, its rollout will be re-run: {e}")
            continue
        if not (0 <= pair[0] < n and 0 <= pair[1] < r):
            raise EvalInputError(
                f"{path}:{lineno} is task {pair[0]} rollout {pair[1]}, outside this eval's {n} tasks x {r} rollouts; "
                "resume with the earlier eval's -n and -r"
            )
        latest[pair] = trace
        attempts[pair] += 1
    kept = {pair: trace for pair, trace in latest.items() if not trace.has_error}
    errored = len(latest) - len(kept)
    logger.info(
        f"env {name!r}: kept {len(kept)} of {n * r} rollouts from {path}; re-running {errored} errored "
        f"and {n * r - len(latest)} missing" + (f" ({unreadable} unreadable lines)" if unreadable else "")
    )
    return kept, attempts
