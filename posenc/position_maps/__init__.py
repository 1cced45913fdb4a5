"""Training-free context extension as attention position maps: one file per method, registered here.

`LlamaConfig(attention_extension={"type": "self_extend", "group_size": 8, "window": 1024})` (and GPTConfig's
field of the same name) picks one; `build_position_map` validates the dict with one-line errors and fills
the defaults that depend on the trained length. See base.py for the form every method takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc.errors import bad_value, unknown_key, unknown_name
from posenc.position_maps.attention_sinks import AttentionSinks
from posenc.position_maps.base import FIELD, PositionMap
from posenc.position_maps.dual_chunk import DualChunk
from posenc.position_maps.lm_infinite import LMInfinite
from posenc.position_maps.self_extend import SelfExtend
from posenc.position_maps.string_map import String

POSITION_MAPS: dict[str, type[PositionMap]] = {
    cls.name: cls for cls in (SelfExtend, DualChunk, LMInfinite, AttentionSinks, String)
}


def build_position_map(spec: Mapping[str, Any] | None, max_seq_len: int) -> PositionMap | None:
    """The config dict -> its PositionMap (defaults resolved), or None for None."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise bad_value(FIELD, spec, f"None or a dict with a 'type' ({', '.join(sorted(POSITION_MAPS))})")
    kind = spec.get("type")
    if kind not in POSITION_MAPS:
        raise unknown_name(f"{FIELD}.type", kind, POSITION_MAPS)
    cls = POSITION_MAPS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    for key in spec:
        if key != "type" and key not in names:
            raise unknown_key(FIELD, key, names | {"type"})
    try:
        built = cls(**{k: v for k, v in spec.items() if k != "type"})
    except TypeError:  # a required option left out
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in spec
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        raise bad_value(FIELD, dict(spec), f"{kind} needs {', '.join(missing)}") from None
    return built.resolved(max_seq_len)


__all__ = ["POSITION_MAPS", "AttentionSinks", "DualChunk", "LMInfinite", "PositionMap", "SelfExtend",
           "String", "build_position_map"]
