"""Helpers every position map method shares: the config field's name, its integer check, and i - j.

The protocol itself (PositionMap: maps, selector, options) lives in posenc/position_map.py, below both posenc.nn
(which evaluates a map) and this folder (which defines the methods); it is re-exported here.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from posenc.errors import bad_value
from posenc.position_map import PositionMap

FIELD = "attention_extension"


def whole(name: str, value: Any, low: int, allowed: str | None = None) -> None:
    """An integer >= low, or a one-line error naming attention_extension.<name>."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise bad_value(f"{FIELD}.{name}", value, allowed or f"an integer >= {low}")


def distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(B,C), (B,Tk) -> i - j as (B,C,Tk) int64."""
    return q_pos[:, :, None] - k_pos[:, None, :]


__all__ = ["FIELD", "PositionMap", "distance", "whole"]
