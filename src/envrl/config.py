"""One config loader for every entry point: defaults, `--config` files, command-line overrides, renamed keys, then
one validation; any problem is a `ConfigError` of ONE line naming the dotted key, its source and the closest key."""

from __future__ import annotations

import copy
import json
import sys
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import tomli_w
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envrl.config_migrations import MIGRATIONS, Migration, for_model, refused
from envrl.config_schema import Key, config_help, descend, describe_error, display_key, models_at, types_at_path

C = TypeVar("C", bound="BaseConfig")

CLI_SOURCE = "the command line"


class BaseConfig(BaseModel):
    """Base of every config model: unknown keys are errors, field docstrings are the help text.

    A plain pydantic model, not a pydantic-settings one: values come only from the loader below
    (TOML files and CLI overrides), never from environment variables or dotenv files, so the
    resolved config is exactly what `--dry-run` prints. docs/config.md says why the loader does
    its own argv parsing.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)

    cli_aliases: ClassVar[dict[str, str]] = {}
    """Short flags of an entry point's config: {"n": "num-examples"} makes `-n 20` mean `--num-examples 20`."""
    owned_keys: ClassVar[frozenset[str]] = frozenset()
    """Dotted keys (and whole sections) that the entry point sets itself: left out of `--help`, and
    the entry point refuses them when given (e.g. `rl` sets `trainer.output_dir` from `output_dir`)."""
    help_keys: ClassVar[tuple[str, ...]] = ()
    """The keys (and whole sections) people change: `--help` lists only these, `--help-all` every
    key; empty: `--help` lists every key."""


class ConfigError(Exception):
    """A config problem, already phrased as the one line the user will see."""


class _Layers:
    """Merged raw config values plus, for every key, the source that set it last."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.sources: dict[Key, str] = {}

    def merge(self, values: dict[str, Any], source: str, prefix: Key = ()) -> None:
        target = self.data
        for part in prefix:
            target = target.setdefault(part, {})
        self._merge_into(target, values, source, prefix)

    def _merge_into(self, target: dict[str, Any], values: dict[str, Any], source: str, prefix: Key) -> None:
        for key, value in values.items():
            path = (*prefix, key)
            self.sources[path] = source
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                self._merge_into(target[key], value, source, path)
            else:
                target[key] = value
                self._mark_subtree(value, source, path)

    def _mark_subtree(self, value: Any, source: str, path: Key) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                self.sources[(*path, key)] = source
                self._mark_subtree(child, source, (*path, key))

    def node(self, path: Key) -> Any:
        """What sits at `path` (a list's tables by index); None past the data."""
        node: Any = self.data
        for part in path:
            node = descend(node, part)
        return node

    def pop(self, path: Key) -> tuple[bool, Any]:
        """Take the value at `path` out (False when there is none)."""
        node = self.node(path[:-1])
        if not isinstance(node, dict) or path[-1] not in node:
            return False, None
        return True, node.pop(path[-1])

    def tables(self, at: Key = ()) -> list[Key]:
        """Every table's path, `at` first, then each level's before the next (a list's tables too)."""
        out, level = [], [at]
        while level:
            out += level
            level = [(*path, key) for path in level for key, child in _children(self.node(path)) if _is_table(child)]
        return out

    def source_of(self, loc: Key) -> str | None:
        for end in range(len(loc), 0, -1):
            if loc[:end] in self.sources:
                return self.sources[loc[:end]]
        return None


# ---------------------------------------------------------------------------------------------
# Reading the command line


class ParsedArgs(BaseModel):
    config_files: list[Path] = []
    overrides: list[tuple[str, str | None]] = []
    dry_run: bool = False
    help: bool = False
    help_all: bool = False


def _split_argv(argv: Sequence[str], aliases: Mapping[str, str] = {}) -> ParsedArgs:
    parsed = ParsedArgs()
    i = 0
    while i < len(argv):
        arg = _expand_alias(argv[i], aliases)
        if arg in ("-h", "--help", "--help-all"):
            parsed.help, parsed.help_all = True, arg == "--help-all"
        elif arg == "--dry-run":
            parsed.dry_run = True
        elif arg == "--config" or arg.startswith("--config="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise ConfigError("--config needs a path to a TOML file")
            parsed.config_files.append(Path(value))
        elif arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            if eq:
                parsed.overrides.append((name, value))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                parsed.overrides.append((name, argv[i]))
            else:
                parsed.overrides.append((name, None))
        else:
            short = "".join(f", -{flag} (--{key})" for flag, key in aliases.items())
            raise ConfigError(f"unexpected argument {arg!r}: options look like --section.key VALUE{short}")
        i += 1
    return parsed


def _expand_alias(arg: str, aliases: Mapping[str, str]) -> str:
    """`-n 20` / `-n=20` as `--num-examples ...` when the config declares that alias."""
    flag, eq, value = arg[1:].partition("=")
    if arg.startswith("-") and not arg.startswith("--") and flag in aliases:
        return f"--{aliases[flag]}{eq}{value}"
    return arg


def _is_textual(tp: Any) -> bool:
    if typing.get_origin(tp) is Literal:
        return all(isinstance(v, str) for v in typing.get_args(tp))
    return isinstance(tp, type) and issubclass(tp, (str, Path))


def _parse_override(model: type[BaseModel], name: str, raw: str | None) -> tuple[list[str], Any]:
    """Turn `--a.b-c VALUE` into (["a", "b_c"], value), reading VALUE by the field's type."""
    path = [part.replace("-", "_") for part in name.split(".")]
    field_types = types_at_path(model, path)
    if raw is None:
        if field_types is None and path[-1].startswith("no_"):
            negated = [*path[:-1], path[-1][3:]]
            if bool in (types_at_path(model, negated) or []):
                return negated, False
        if field_types is None or bool in field_types:
            return path, True
        for table in field_types:  # a table with a `FLAG` (key, value): `--table` sets that key
            if isinstance(table, type) and issubclass(table, BaseModel) and hasattr(table, "FLAG"):
                return [*path, table.FLAG[0]], table.FLAG[1]
        raise ConfigError(f"--{name} needs a value (it is not a true/false flag)")
    if field_types and all(_is_textual(t) or t is type(None) for t in field_types):
        return path, raw
    try:
        return path, json.loads(raw)
    except json.JSONDecodeError:
        return path, raw


# ---------------------------------------------------------------------------------------------
# Public API


def read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (working directory {Path.cwd()})")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def resolve_config(
    cls: type[C],
    config_files: Sequence[Path] = (),
    overrides: Sequence[tuple[str, str | None]] = (),
    base: dict[str, Any] | None = None,
    *,
    warn: Callable[[str], None] = logger.warning,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> C:
    """Build `cls` from `base` values, then TOML files, then CLI overrides, then the renamed keys
    that still work under their new names (each `warn`ed once); raise ConfigError."""
    layers = _Layers()
    if base:
        layers.merge(copy.deepcopy(base), "the caller's defaults")  # later layers merge into it
    for path in config_files:
        layers.merge(read_toml(Path(path)), str(path))
    for name, raw in overrides:
        path, value = _parse_override(cls, name, raw)
        nested: Any = value
        for part in reversed(path[1:]):
            nested = {part: nested}
        layers.merge({path[0]: nested}, f"--{name} on {CLI_SOURCE}")
    _migrate(cls, layers, warn, migrations)
    try:
        return cls.model_validate(layers.data)
    except ValidationError as e:
        raise ConfigError(describe_error(e.errors()[0], cls, layers.data, layers.source_of, migrations)) from None


def _children(node: Any) -> list[tuple[str | int, Any]]:
    return list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and any(isinstance(item, dict) for item in value))


def _migrate(cls: type[BaseModel], layers: _Layers, warn: Callable[[str], None], table: Sequence[Migration]) -> None:
    """Move each old key that still works to its new key (or drop a removed one), with a warning, in
    every table its row's model sits at (each table of a list too); an old key past its `removed_in`
    stays, for validation to refuse it."""
    for at in layers.tables():
        if not isinstance(layers.node(at), dict):
            continue
        models = models_at(cls, at, layers.data)
        for migration in for_model(models, table):
            if any(types_at_path(model, migration.old.split(".")) for model in models):
                continue  # a key of a subclass (a server's pool) that its base (an env table's) no longer has
            old = (*at, *migration.old.split("."))
            source = layers.source_of(old)
            found, value = (False, None) if refused(migration) else layers.pop(old)
            if not found:
                continue
            if migration.new is not None:
                new = (*at, *migration.new.split("."))
                if layers.node(new) is not None:
                    raise ConfigError(
                        f"config key '{display_key(old)}' (from {source}) was renamed to '{display_key(new)}', "
                        "which is set too: keep only the new key"
                    )
                nested: Any = value
                for part in reversed(new[len(at) + 1 :]):
                    nested = {part: nested}
                layers._merge_into(layers.node(at), {new[len(at)]: nested}, source or "a renamed key", at)
            warn(migration.warning(source, display_key(old)))


def config_to_toml(config: BaseModel, *, only_set: bool = False) -> str:
    """The resolved config as TOML (None values are left out: TOML has no null); `only_set`: just
    the keys that were given (by a file, the command line or the caller), not the defaults."""
    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True, exclude_unset=only_set))


def load_config(
    cls: type[C],
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    dry_run: Callable[[C], str] = config_to_toml,
    epilog: str = "",
) -> C:
    """Entry-point helper: parse argv into `cls`, print one-line errors and exit 2 on bad input.

    `--help` prints the keys people change (`help_keys`), `--help-all` every key, each with its
    description; `--dry-run` prints `dry_run(config)` (the
    resolved config as TOML unless the entry point resolves more) and exits 0; `epilog` ends the help.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _split_argv(argv, cls.cli_aliases)
        if args.help:
            print(config_help(cls, prog, epilog, every_key=args.help_all))
            raise SystemExit(0)
        config = resolve_config(cls, args.config_files, args.overrides, warn=partial(_warn, prog))
        if args.dry_run:
            print(dry_run(config), end="")
            raise SystemExit(0)
    except ConfigError as e:
        print(f"{prog}: config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return config


def _warn(prog: str, line: str) -> None:
    print(f"{prog}: config warning: {line}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Config pieces shared by several processes


class ModelConfig(BaseConfig):
    name: str = "deps/models/tiny-chat"
    """HF model directory (or hub id where a hub is reachable) used by trainer and inference alike."""


class RunDirKeys(BaseConfig):
    """The model and run directory, declared once for `rl` and every process of its run (`rl`
    copies its own into each process's section)."""

    model: ModelConfig = ModelConfig()
    output_dir: Path = Path("outputs/rl")
    """Run directory: logs/, configs/, rollouts/, weights/, checkpoints/, metrics.jsonl. `rl` makes it
    private to its owner (mode 0700) unless `output_dir_group` names a group that may read it."""


class RunKeys(RunDirKeys):
    """The run's length and async bound besides, declared once for `rl`, trainer and orchestrator."""

    max_steps: int = Field(20, ge=1)
    """Training steps: the trainer takes one optimizer step per published batch (step n trains on
    `rollouts/step_<n>/`)."""
    max_async_level: int = Field(1, ge=0)
    """Batch n may be generated by any policy >= n - max_async_level (0: fully on-policy); the trainer
    refuses an older sample."""
