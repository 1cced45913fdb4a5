"""Validators for the values of config sections that posenc.validators does not cover: lists of ints and
names, booleans and path text. Each error names the field, the value and what is allowed."""

from __future__ import annotations

from typing import Any

from posenc.errors import bad_value


def int_list(name: str, value: Any, low: int, high: int | None = None, why: str = "") -> tuple[int, ...]:
    """A YAML list of ints in [low, high], as a tuple (so configs compare equal after a JSON round trip)."""
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high) for v in value)
    if not ok:
        span = f">= {low}" if high is None else f"in [{low}, {high:,}]{f' ({why})' if why else ''}"
        raise bad_value(name, value, f"a non-empty list of integers {span}, e.g. [{low}, {max(low, 1) * 2}]")
    return distinct(name, tuple(value))


def name_list(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise bad_value(name, value, "a non-empty list of names, e.g. [rope, alibi]")
    return distinct(name, tuple(value))


def distinct(name: str, values: tuple) -> tuple:
    """A list of units or lengths names each once: a repeat would run (or count) the same thing twice."""
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
        raise bad_value(name, list(values), f"distinct values ({repeated[0]!r} is listed twice)")
    return values


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise bad_value(name, value, "true or false")


def path_text(name: str, value: Any, allowed: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise bad_value(name, value, allowed)


def set_field(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclass: normalise in __post_init__
