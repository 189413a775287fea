"""A dotted key followed through the config models exactly as pydantic validates it (overrides, `--help`,
did-you-mean, the surface's key count), and any validation error as ONE line naming the key as the user wrote it and
where it was set."""

from __future__ import annotations

import difflib
import json
import shutil
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from envrl.config_migrations import MIGRATIONS, Migration, for_model

Key = tuple[str | int, ...]


def unwrap_types(annotation: Any) -> list[Any]:
    """The concrete types an annotation may hold (Optional/Union/Annotated peeled off)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unwrap_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in unwrap_types(arg)]
    return [annotation]


def _step(types_: list[Any], part: str | int) -> list[Any]:
    """Types reachable from `types_` through one key (a field name or a list index)."""
    out: list[Any] = []
    for tp in types_:
        if isinstance(part, int):
            if typing.get_origin(tp) is list:
                out.extend(unwrap_types(typing.get_args(tp)[0]))
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            out.extend(unwrap_types(tp.model_fields[part].annotation))
    return out


def descend(node: Any, part: str | int) -> Any:
    """What sits at `part` of a table or array of raw config data (None past its end, or below a value)."""
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    return None


def models_at(model: type[BaseModel], path: Sequence[str | int], data: Any = None) -> list[type[BaseModel]]:
    """Models that may sit at `path`; with `data`, union members are narrowed by its `type` tag."""
    types_: list[Any] = [model]
    node = data
    for part in path:
        types_ = _step(types_, part)
        node = descend(node, part)
    # A list of tables also stands for its item model: models that take one table as a one-item
    # list (`--env.id x` for `env: list[EnvConfig]`) get their keys typed and checked too.
    items = [t for tp in types_ if typing.get_origin(tp) is list for t in unwrap_types(typing.get_args(tp)[0])]
    models = [t for t in [*types_, *items] if isinstance(t, type) and issubclass(t, BaseModel)]
    tag = node.get("type") if isinstance(node, dict) else None
    tagged = [m for m in models if tag is not None and tag in _type_tags(m)]
    return tagged or models


def _type_tags(model: type[BaseModel]) -> tuple[Any, ...]:
    field = model.model_fields.get("type")
    if field is None or typing.get_origin(field.annotation) is not Literal:
        return ()
    return typing.get_args(field.annotation)


def types_at_path(model: type[BaseModel], path: Sequence[str]) -> list[Any] | None:
    """Types a dotted path may hold in `model`, or None if no model defines it."""
    return _step(models_at(model, path[:-1]), path[-1]) or None


def display_key(loc: Key) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _data_loc(loc: Key, data: Any) -> Key:
    """Drop the union tags pydantic inserts into error locations (e.g. ('pool', 'static', 'x')).

    A tag is a key that is not in the data yet is followed by more of the location (the `type`
    may be absent when the union has a default member).
    """
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part not in node and i < len(loc) - 1:
            continue
        out.append(part)
        node = descend(node, part)
    return tuple(out)


def _nested_home(parents: list[type[BaseModel]], key: str) -> list[str]:
    """`["pool.num_workers"]` when `key` is a field of a table one level down (written one level too high)."""
    homes = [f"{name}.{key}" for parent in parents for name in parent.model_fields for t in _step([parent], name)
             if isinstance(t, type) and issubclass(t, BaseModel) and key in t.model_fields]  # fmt: skip
    return homes[:1]


def describe_error(
    error: dict[str, Any],
    model: type[BaseModel],
    data: Any,
    source_of: Callable[[Key], str | None],
    migrations: Sequence[Migration] = MIGRATIONS,
) -> str:
    """Pydantic's `error` as one line: the dotted key, where its value came from (`source_of`), and
    for an unknown key its new name or why it went (`migrations`), its home one table down or the
    closest valid key."""
    loc = _data_loc(tuple(error["loc"]), data)
    key = display_key(loc) or "<top level>"
    source = source_of(loc)
    where = f" (from {source})" if source else ""
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"unknown config key '{key}'{where}{_unknown_key_hint(model, loc, data, migrations)}"
    if kind == "missing":
        return f"missing required config key '{key}'{where}"
    if kind == "union_tag_not_found":
        tags = sorted({tag for m in models_at(model, loc, data) for tag in _type_tags(m)})
        return f"'{key}'{where} needs a 'type' key; one of {', '.join(repr(t) for t in tags)}"
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        return f"'{key}.type' is {ctx.get('tag')!r}{where}; expected one of {ctx.get('expected_tags')}"
    value = error.get("input")
    if kind == "value_error" and isinstance(value, dict):  # a check across the section's keys: its message names them
        return f"in '{key}'{where}: {error['msg'].removeprefix('Value error, ')}"
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return f"bad value for '{key}'{where}: {error['msg']} (got {shown})"


def _migration_of(
    model: type[BaseModel], loc: Key, parents: list[type[BaseModel]], migrations: Sequence[Migration]
) -> tuple[Migration, Key] | None:
    """The row for the unknown key at `loc` and the path its new key is relative to: a row of the
    root `model` naming the whole dotted key, else one of a model that may hold the key."""
    dotted = ".".join(str(part) for part in loc)
    for row in for_model([model], migrations):
        if row.model == model.__name__ and row.old == dotted:
            return row, ()
    for row in for_model(parents, migrations):
        if row.old == str(loc[-1]):
            return row, loc[:-1]
    return None


def _unknown_key_hint(model: type[BaseModel], loc: Key, data: Any, migrations: Sequence[Migration]) -> str:
    """What follows "unknown config key 'x'": why it went, its new name, its home or the closest key."""
    parents = models_at(model, loc[:-1], data)
    found = _migration_of(model, loc, parents, migrations)
    if found is not None and found[0].new is None:
        return f"; it was removed: {found[0].note}"
    if found is not None and found[0].new is not None:
        return f"; did you mean '{display_key((*found[1], *found[0].new.split('.')))}'? (the key was renamed)"
    valid = sorted({name for m in parents for name in m.model_fields})
    close = _nested_home(parents, str(loc[-1])) or difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
    if close:
        return f"; did you mean '{display_key((*loc[:-1], *close[0].split('.')))}'?"
    parent = display_key(loc[:-1])
    return f"; valid keys{' under ' + repr(parent) if parent else ''}: {', '.join(valid)}" if valid else ""


HELP_WIDTH = 100
"""Columns `--help` fits in (fewer on a narrower terminal)."""


def config_help(cls: type[BaseModel], prog: str, epilog: str = "", *, every_key: bool = False) -> str:
    """Each key as a `--flag` (`cls.help_keys` only, unless `every_key`), grouped by section (top-level
    keys first), with its description, default or `(required)`, wrapped to the terminal (at most
    `HELP_WIDTH` columns); a brief help ends saying how many keys `--help-all` adds."""
    width = min(HELP_WIDTH, shutil.get_terminal_size((HELP_WIDTH, 24)).columns)
    brief = () if every_key else getattr(cls, "help_keys", ())
    lines = [
        f"usage: {prog} [--config FILE.toml ...] [--section.key VALUE ...] [--dry-run] [--help-all]",
        "",
        *textwrap.wrap(
            "Later --config files deep-merge over earlier ones; --key overrides come last. Lists and dicts "
            "are JSON; booleans are --flag / --no-flag. --dry-run prints the resolved config as TOML.",
            width=width,
        ),
    ]
    shorts = list(getattr(cls, "cli_aliases", {}).items())
    owned = getattr(cls, "owned_keys", frozenset())
    sections: dict[str, list[str]] = {}
    hidden = 0

    def walk(model: type[BaseModel], prefix: str, section: str) -> None:
        nonlocal hidden
        for name, field in model.model_fields.items():
            if f"{prefix}{name}" in owned:
                continue
            key = f"{prefix}{name}".replace("_", "-")
            sub = [t for t in unwrap_types(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
            if len(sub) == 1 and len(unwrap_types(field.annotation)) == 1:
                walk(sub[0], f"{prefix}{name}.", section or name)
                continue
            if brief and not any(f"{prefix}{name}" == k or f"{prefix}{name}".startswith(f"{k}.") for k in brief):
                hidden += 1
                continue
            short = "".join(f", -{flag}" for flag, target in shorts if target.replace("_", "-") == key)
            when = (
                "(required)"
                if field.is_required()
                else f"[default: {_short(field.get_default(call_default_factory=True))}]"
            )
            text = " ".join((field.description or "").split())
            entry = sections.setdefault(section or "general", [])
            entry.append(f"  --{key}{short}")
            entry += textwrap.wrap(
                f"{text} {when}".strip(), width=width, initial_indent=" " * 6, subsequent_indent=" " * 6
            )

    walk(cls, "", "")
    general = sections.pop("general", [])
    for section, entries in {"general": general, **sections}.items() if general else sections.items():
        lines += ["", f"{section}:", *entries]
    if hidden:
        lines += ["", f"{hidden} more options (timeouts, tuning, hosts, cores): {prog} --help-all"]
    return "\n".join([*lines, "", epilog] if epilog else lines)


def _short(value: Any) -> str:
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"))
    return json.dumps(value) if isinstance(value, (list, dict, str)) else str(value)


def leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted leaf key of `model` (tables in lists and union members walked, each key once)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        types_ = unwrap_types(field.annotation)
        items = [t for tp in types_ if typing.get_origin(tp) is list for t in unwrap_types(typing.get_args(tp)[0])]
        tables = [t for t in [*types_, *items] if isinstance(t, type) and issubclass(t, BaseModel)]
        if not tables:
            out.append(f"{prefix}{name}")
        for table in tables:
            out += [key for key in leaf_keys(table, f"{prefix}{name}.") if key not in out]
    return out


def user_keys(model: type[BaseModel]) -> list[str]:
    """The leaf keys a user may set: all but those the entry point sets itself (`owned_keys`; an owned
    table owns every key below it)."""
    owned = getattr(model, "owned_keys", frozenset())
    return [key for key in leaf_keys(model) if not any(key == o or key.startswith(f"{o}.") for o in owned)]
