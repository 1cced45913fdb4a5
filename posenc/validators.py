"""Field validators shared by the config dataclasses of the library and the experiments: each error
names the field, the value and what is allowed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from posenc.errors import bad_value, unknown_key

T = TypeVar("T")


def positive_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_value(field, value, "a positive integer")


def non_negative_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_value(field, value, "a non-negative integer")


def number_in(field: str, value: Any, low: float, high: float, low_open: bool = False,
              high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise bad_value(field, value, f"a number in {left}{low:g}, {high:g}{right}")


def optional_number_at_least(field: str, value: Any, low: float, allowed: str) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
        raise bad_value(field, value, allowed)


def from_dict(cls: type[T], data: Mapping[str, Any], section: str = "") -> T:
    """Build a config dataclass from a dict; an unknown key names the nearest valid one. A model config
    also takes its schemes' options flat (`accepted_keys`)."""
    accepted = getattr(cls, "accepted_keys", None)
    names = accepted() if accepted is not None else {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise unknown_key(section, key, names)
    return cls(**data)
