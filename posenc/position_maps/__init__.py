"""Training-free context extension as attention position maps: one file per method, each registered by name in
posenc/registry.py (POSITION_MAPS, beside the schemes; a user's own joins with registry.register_position_map).

`LlamaConfig(attention_extension={"type": "self_extend", "group_size": 8, "window": 1024})` (and GPTConfig's
field of the same name) picks one; `posenc.registry.build_position_map` validates the dict with one-line errors
and fills the defaults that depend on the trained length. See base.py for the form every method takes.
"""

from __future__ import annotations

from posenc.position_maps.attention_sinks import AttentionSinks
from posenc.position_maps.base import PositionMap
from posenc.position_maps.dual_chunk import DualChunk
from posenc.position_maps.lm_infinite import LMInfinite
from posenc.position_maps.self_extend import SelfExtend
from posenc.position_maps.string_map import String

__all__ = ["AttentionSinks", "DualChunk", "LMInfinite", "PositionMap", "SelfExtend", "String"]
