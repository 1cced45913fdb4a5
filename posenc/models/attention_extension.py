"""A model config's attention_extension: the dict validated against the model's scheme (a rotary scheme with a
static rope_scaling, in a causal stack), and the scheme wrapped in its position map (position_maps/scheme.py).
The dict becomes a PositionMap through the registry (registry.build_position_map), as a scheme name does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.errors import bad_value
from posenc.position_maps.base import FIELD
from posenc.position_maps.scheme import PositionMapped
from posenc.registry import build_position_map
from posenc.rotary.rope import scaling_from_config
from posenc.rotary.scaling import SEQ_LEN_DEPENDENT, rope_type
from posenc.scheme import Dims, Scheme


def check_position_map(spec: Mapping[str, Any] | None, scheme_name: str, scheme_cls: type[Scheme],
                       dims: Dims, options: Any) -> None:
    """The config's validator: the dict itself, then whether this model's scheme can carry it."""
    if build_position_map(spec, dims.max_seq_len) is None:
        return
    hooks = ("bias", "embed", "mix_values", "relative_rows", "contextual_rows", "attend")
    rotary_only = scheme_cls.rotate is not Scheme.rotate and all(
        getattr(scheme_cls, h) is getattr(Scheme, h) for h in hooks)
    if not rotary_only or scheme_cls.needs_weights:
        raise bad_value(FIELD, dict(spec), f"None with position_embedding_type={scheme_name!r}: the methods remap "
                        "the positions of a rotary scheme (rope, p_rope, xpos)")
    if not dims.causal:
        raise bad_value(FIELD, dict(spec), "None in a bidirectional stack: the methods are causal")
    kind = rope_type(scaling_from_config(options))
    if kind in SEQ_LEN_DEPENDENT:
        raise bad_value(FIELD, dict(spec), f"None with rope_scaling {kind!r} (its frequencies follow the length "
                        "seen); a static scaling (linear, yarn, llama3, ntk) composes")


def wrap(scheme: Scheme, spec: Mapping[str, Any] | None) -> Scheme:
    """The scheme itself without a spec, else wrapped (the config validated the spec already)."""
    position_map = build_position_map(spec, scheme.dims.max_seq_len)
    return scheme if position_map is None else PositionMapped(scheme, position_map)


__all__ = ["check_position_map", "wrap"]
