"""One config mechanism for every command: defaults <- YAML preset <- `section.key=value`
overrides, checked against a schema.

A schema is a frozen dataclass whose fields are sections (config objects: a frozen dataclass, or
any object with a flat `to_dict()` and a constructor taking those keys, like GPTConfig) or plain
top-level values (`out_dir`). The schema's own defaults are the starting point, so a section given
in part keeps the command's defaults for the rest. OmegaConf parses YAML and the dotted values;
unknown keys are one-line errors naming the nearest valid key; bad values are ValueErrors from
the dataclass that owns them. A schema may name `derived` keys (set by the command from other
options): setting one is an error that says where it comes from.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

from posenc.errors import bad_value, unknown_key

S = TypeVar("S")
HIDDEN = {"extra"}  # GPTConfig.extra: experiment notes, not an option


def is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def plain(section: Any) -> dict[str, Any]:
    """A section's options as a flat dict (GPTConfig keeps a flat to_dict whatever its layout)."""
    return section.to_dict() if hasattr(section, "to_dict") else dataclasses.asdict(section)


def as_dict(config: Any) -> dict[str, Any]:
    """A schema instance as plain data: each section flat, top-level values as they are (run.json, checkpoints)."""
    return {f.name: plain(v) if is_section(v := getattr(config, f.name)) else v for f in dataclasses.fields(config)}


def accepted_keys(section: Any) -> set[str]:
    """Every key a section takes: a model config also takes every registered scheme's options, flat."""
    accepted = getattr(section, "accepted_keys", None)
    return set(accepted()) if accepted is not None else set(plain(section))


def _plain_or_value(value: Any) -> Any:
    return plain(value) if is_section(value) else value


def derived(schema: type) -> dict[str, str]:
    return dict(getattr(schema, "derived", {}))


def aliases(schema: type) -> dict[str, str]:
    """Old spellings of renamed keys -> their names now (a top-level old key -> `section.key`)."""
    return dict(getattr(schema, "aliases", {}))


def _renamed(schema: type, layer: dict[str, Any], notice: bool) -> dict[str, Any]:
    """The layer with every old spelling moved to its name now; with `notice`, one line per old key
    on stderr saying so (the old spelling keeps working)."""
    renamed = aliases(schema)
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if isinstance(value, dict):  # a section; its own keys may have been renamed (`section.old`)
            value = {_inner_name(renamed, key, option, notice): v for option, v in value.items()}
        if key not in renamed or isinstance(value, dict):  # a mapping is a section that kept its name
            out[key] = {**out[key], **value} if isinstance(out.get(key), dict) and isinstance(value, dict) else value
            continue
        section, _, option = renamed[key].partition(".")
        if notice:
            print(f"posenc: note: `{key}` is now `{renamed[key]}` (the old spelling still works)", file=sys.stderr)
        current = out.get(section, {})
        out[section] = {**current, option: value} if isinstance(current, dict) else current
    return out


def _inner_name(renamed: dict[str, str], section: str, option: str, notice: bool) -> str:
    """A section's option under its name now: `section.old` -> `section.new` when the schema renamed it."""
    now = renamed.get(f"{section}.{option}")
    if now is None:
        return option
    if notice:
        print(f"posenc: note: `{section}.{option}` is now `{now}` (the old spelling still works)", file=sys.stderr)
    return now.partition(".")[2]


def load(schema: type[S], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
         base: S | None = None) -> S:
    """The schema's defaults (or `base`, e.g. a saved run's settings), then the YAML file at `path`,
    then each override in order."""
    default = schema()
    start = default if base is None else base
    merged = {f.name: _plain_or_value(getattr(start, f.name)) for f in dataclasses.fields(schema)}
    layers = ([_yaml(path)] if path is not None else []) + [_override(schema, item) for item in overrides]
    layers = [_renamed(schema, layer, notice=True) for layer in layers]
    sections = {f.name for f in dataclasses.fields(schema) if is_section(getattr(default, f.name))}
    given = _given(layers, sections)
    for layer in layers:
        for key, value in layer.items():
            if key in sections:
                if not isinstance(value, dict):  # `model:` null, a number or a list: refuse, never reset
                    raise bad_value(key, value, f"a mapping of {key}.* options (e.g. {key}:\\n  key: value)")
                _check_not_derived(schema, key, value)
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    config = build(schema, merged)
    check_used(config, given)
    return config


def _given(layers: list[dict[str, Any]], sections: set[str]) -> dict[str, Any]:
    """Every dotted key the YAML file or an override sets, with its value (the last one given)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in sections and isinstance(value, dict):
                out.update({f"{key}.{option}": v for option, v in value.items()})
            else:
                out[key] = value
    return out


def check_used(config: Any, given: dict[str, Any]) -> None:
    """Refuse a key set by the user that this config never reads (its `unused()`: dotted key, or `section.`
    for a whole section -> why), so no value is recorded in run.json and silently ignored."""
    unused = getattr(config, "unused", None)
    if unused is None:
        return
    for key, why in unused().items():
        for name, value in given.items():
            if name == key or (key.endswith(".") and name.startswith(key)):
                raise bad_value(name, value, f"not used here: {why}")


def build(schema: type[S], data: dict[str, Any]) -> S:
    """The schema from plain data (a loaded YAML, or a config saved as JSON by an earlier run)."""
    default = schema()
    names = [f.name for f in dataclasses.fields(schema)]
    data = _renamed(schema, data, notice=False)  # a config saved under old names reads as it was meant
    for key in data:
        if key not in names:
            raise unknown_key("", key, names)
    parts = {}
    for name in names:
        if name not in data:
            continue
        section, value = getattr(default, name), data[name]
        if not is_section(section):
            parts[name] = value
            continue
        if not isinstance(value, dict):
            raise bad_value(name, value, f"a mapping of {name}.* options")
        valid, keys = plain(section), accepted_keys(section)
        for key in value:
            if key not in keys:
                raise unknown_key(name, key, [k for k in keys if k not in HIDDEN])
        parts[name] = type(section)(**{**valid, **value})
    return schema(**parts)


def _yaml(path: str | Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise bad_value("config", str(path), "an existing YAML file")
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # OmegaConf raises many types; all mean the same to the user
        raise bad_value("config", str(path), f"valid YAML ({str(err).splitlines()[0]})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise bad_value("config", str(path), "a YAML mapping of sections (model:, trainer:, ...)")
    return loaded


def _override(schema: type, item: str) -> dict[str, Any]:
    if "=" not in item:
        raise bad_value("override", item, "section.key=value, e.g. trainer.max_steps=2000")
    key = item.split("=", 1)[0]
    default = schema()
    scalars = [f.name for f in dataclasses.fields(schema) if not is_section(getattr(default, f.name))]
    sections = [f.name for f in dataclasses.fields(schema) if is_section(getattr(default, f.name))]
    if "." not in key and key not in scalars and key not in aliases(schema):
        near = difflib.get_close_matches(key, [*scalars, *aliases(schema)], n=1)  # a typo of a flat key
        if near:
            meant = aliases(schema).get(near[0], near[0])
            raise bad_value("override", item, f"section.key=value (did you mean '{meant}'?)")
        raise bad_value("override", item, "section.key=value with a section (" + ", ".join(sections) + ")"
                        + "".join(f" or {name}=value" for name in scalars))
    try:
        layer = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=True)
    except Exception as err:  # one at a time, so the message names the override that failed
        raise bad_value("override", item, f"key=value with a YAML value ({str(err).splitlines()[0]})") from None
    return layer


def _check_not_derived(schema: type, section: str, values: dict[str, Any]) -> None:
    for key, why in derived(schema).items():
        name, _, option = key.partition(".")
        if name == section and option in values:
            raise bad_value(key, values[option], f"not set here: {why}")


def describe(schema: type) -> str:
    """Every option with its default and the reason given beside it in the source, for --help."""
    default, lines, fixed = schema(), [], derived(schema)
    for f in dataclasses.fields(schema):
        value = getattr(default, f.name)
        if not is_section(value):
            lines.append(_line(f.name, value, _comments(schema).get(f.name)))
            continue
        notes, class_defaults = {**_scheme_comments(value), **_comments(type(value))}, _class_defaults(value)
        for key, option in plain(value).items():
            dotted = f"{f.name}.{key}"
            if key in HIDDEN:
                continue
            # A comment explains the class's default; this command may have chosen another value.
            note = notes.get(key) if class_defaults.get(key, option) == option else None
            lines.append(_line(dotted, option, f"set by the command: {fixed[dotted]}" if dotted in fixed else note))
        lines += _other_scheme_options(f.name, value)
    return "\n".join(lines)


def _scheme_comments(value: Any) -> dict[str, str]:
    """For a model config: each scheme option's source comment, prefixed by the schemes that read it."""
    if not hasattr(value, "accepted_keys"):
        return {}
    from posenc.registry import SCHEMES, option_owners

    notes = {}
    for option, owners in option_owners().items():
        note = _comments(SCHEMES[owners[0]].Options).get(option, "")
        notes[option] = f"{', '.join(owners)}: {note}".rstrip(": ")
    return notes


def _other_scheme_options(section: str, value: Any) -> list[str]:
    """A model config's options of the schemes it does not use now (they apply when the scheme changes)."""
    if not hasattr(value, "accepted_keys"):
        return []
    from posenc.registry import option_default, option_owners

    shown, notes = set(plain(value)), _scheme_comments(value)
    return [_line(f"{section}.{option}", option_default(option), notes[option])
            for option in sorted(option_owners()) if option not in shown]


def _class_defaults(section: Any) -> dict[str, Any]:
    try:
        return plain(type(section)())
    except (TypeError, ValueError):
        return {}


def _line(key: str, value: Any, note: str | None) -> str:
    text = f"  {key} = {value!r}"
    return f"{text:<52s} # {note}" if note else text


_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$")


def _comments(cls: type) -> dict[str, str]:
    """`name: type = default  # why` comments of a dataclass and its bases, by field name."""
    return dict(_source_comments(cls))


@functools.cache  # a class's source is read once per process: every parser() (each main() call) describes its commands
def _source_comments(cls: type) -> dict[str, str]:
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            if m := _COMMENT.match(line):
                notes[m.group(1)] = m.group(2).strip()
    return notes
