"""Validated reads of `rope_scaling` fields: each bad value is a ValueError naming
`rope_scaling.<key>`, the value and what is allowed (HF only logs warnings for these)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.errors import bad_value
from posenc.validators import is_finite_number as _is_number

_MISSING = object()


def number(scaling: Mapping[str, Any], key: str, default: Any = _MISSING, *, above: float | None = None,
           at_least: float | None = None, allowed: str = "") -> float:
    """scaling[key] as a float; `default` when absent or None (HF treats None as absent)."""
    value = scaling.get(key)
    if value is None:
        if default is _MISSING:
            raise bad_value(f"rope_scaling.{key}", None, f"required: {allowed}")
        return default
    ok = _is_number(value) and (above is None or value > above) and (at_least is None or value >= at_least)
    if not ok:
        raise bad_value(f"rope_scaling.{key}", value, allowed)
    return float(value)


def factor(scaling: Mapping[str, Any]) -> float:
    return number(scaling, "factor", at_least=1.0, allowed="a number >= 1.0 (the context-length multiplier)")


def flag(scaling: Mapping[str, Any], key: str, default: bool) -> bool:
    value = scaling.get(key, default)
    if not isinstance(value, bool):
        raise bad_value(f"rope_scaling.{key}", value, "True or False")
    return value


def context_length(scaling: Mapping[str, Any], max_position_embeddings: int | None, rope_type: str) -> int:
    """original_max_position_embeddings, defaulting (as HF does) to the model's max_position_embeddings."""
    value = scaling.get("original_max_position_embeddings", max_position_embeddings)
    if value is None:
        raise bad_value("rope_scaling.original_max_position_embeddings", None,
                        f"the pretrained context length, required by rope_type={rope_type!r} when the model "
                        "gives no max_position_embeddings")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_value("rope_scaling.original_max_position_embeddings", value, "a positive integer")
    return value


def per_pair_factors(scaling: Mapping[str, Any], key: str, n_pairs: int) -> list[float]:
    """LongRoPE's short_factor / long_factor: one positive number per rotary pair."""
    value = scaling.get(key)
    if not isinstance(value, (list, tuple)) or len(value) != n_pairs or not all(
        _is_number(v) and v > 0 for v in value
    ):
        shown = value if not isinstance(value, (list, tuple)) else f"a list of length {len(value)}"
        raise bad_value(f"rope_scaling.{key}", shown, f"a list of {n_pairs} positive numbers (one per rotary pair)")
    return [float(v) for v in value]


def check_keys(scaling: Mapping[str, Any], rope_type: str, keys: frozenset[str], base: float) -> None:
    """Unknown keys are errors (a typo would silently change nothing); rope_theta must agree with the base."""
    allowed = keys | {"rope_type", "type", "rope_theta"}
    for key in scaling:
        if key not in allowed:
            raise bad_value(f"rope_scaling.{key}", scaling[key],
                            f"a key rope_type={rope_type!r} uses: {', '.join(sorted(allowed))}")
    theta = scaling.get("rope_theta")
    if theta is not None and (not _is_number(theta) or abs(theta - base) > 1e-6 * base):
        raise bad_value("rope_scaling.rope_theta", theta, f"absent or equal to rotary_base={base:g}")
