"""Field validators shared by the config dataclasses of the library and the experiments: each error
names the field, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from posenc.errors import bad_value, unknown_key

T = TypeVar("T")


def is_finite_number(value: Any) -> bool:
    """A real number a config may hold: not a bool, NaN or +-inf. JSON has no spelling for the last
    three, so a saved run would read them back as null: nothing non-finite enters a config."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_value(field, value, "a positive integer")


def non_negative_int(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_value(field, value, "a non-negative integer")


def number_in(field: str, value: Any, low: float, high: float, low_open: bool = False,
              high_open: bool = False) -> None:
    ok = is_finite_number(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        if math.isinf(high):
            raise bad_value(field, value, f"a finite number {'>' if low_open else '>='} {low:g}")
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise bad_value(field, value, f"a number in {left}{low:g}, {high:g}{right}")


def optional_number_at_least(field: str, value: Any, low: float, allowed: str) -> None:
    if value is None:
        return
    if not is_finite_number(value) or value < low:
        raise bad_value(field, value, allowed)


def from_dict(cls: type[T], data: Mapping[str, Any], section: str = "") -> T:
    """Build a config dataclass from a dict; an unknown key names the nearest valid one. A model config
    also takes its schemes' options flat (`accepted_keys`)."""
    accepted = getattr(cls, "accepted_keys", None)
    names = accepted() if accepted is not None else {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            err = unknown_key(section, key, names)
            if accepted is not None:  # a model config: the key may be an option of a scheme not imported yet
                err = type(err)(f"{err} (an option of a scheme of your own: pass --import MODULE)")
            raise err
    return cls(**data)
