"""The schemes of a Llama-family decoder's layers, shared by posenc's decoder and by `posenc.hf.apply` (which
puts the same schemes into a transformers model): one stack for the full-attention layers, which also frames
every position, and one for the sliding layers where they differ. A rope_scaling and a position map act on the
layers cfg.extension_layers chooses: all, or the full-attention ones (Gemma 3's default), leaving the sliding
layers their plain rope and window."""

from __future__ import annotations

from posenc.models.llama_config import LlamaConfig
from posenc.models.positions import SchemeStack
from posenc.position_maps.scheme import PositionMapped
from posenc.position_maps.window import Unmapped, Windowed
from posenc.registry import build_position_map
from posenc.scheme import Scheme


def local_stack(cfg: LlamaConfig) -> SchemeStack:
    """The sliding layers' schemes: their own options (Gemma 3's local theta) and, under a position map that
    extension_layers gives them, the map with the window inside it (the map then runs attention, so the window
    must be in the map)."""
    stack = SchemeStack(cfg.position_embedding_type, cfg.dims(), cfg.local_options(), cfg.n_layer)
    position_map = build_position_map(cfg.attention_extension, cfg.max_seq_len)
    if position_map is not None and cfg.extension_layers == "all":
        windowed = Windowed(inner=position_map, window=cfg.sliding_window)
        for i, scheme in enumerate(stack):
            stack[i] = PositionMapped(scheme, windowed)
    return stack


def build_schemes(cfg: LlamaConfig) -> tuple[SchemeStack, SchemeStack | None]:
    """(full-attention stack, sliding stack or None where the sliding layers use the full one's schemes: no
    theta of their own and no map that must hold their window)."""
    schemes = SchemeStack(cfg.position_embedding_type, cfg.dims(), cfg.options, cfg.n_layer, cfg.attention_extension)
    sliding = any(cfg.layer_type(i) == "sliding_attention" for i in range(cfg.n_layer))
    differs = cfg.local_options() != cfg.options or cfg.attention_extension is not None
    return schemes, (local_stack(cfg) if sliding and differs else None)


def layer_scheme(cfg: LlamaConfig, schemes: SchemeStack, local: SchemeStack | None, index: int) -> Scheme:
    sliding = local is not None and cfg.layer_type(index) == "sliding_attention"
    return (local if sliding else schemes).layer(index)


def mapped_layer_scheme(cfg: LlamaConfig, schemes: SchemeStack, local: SchemeStack | None, index: int) -> Scheme:
    """The layer's scheme where a map runs every layer's attention (posenc.hf.apply under a position map): a
    sliding layer the map does not act on keeps its window in a map of true positions (Windowed(Unmapped))."""
    scheme = layer_scheme(cfg, schemes, local, index)
    if cfg.attention_extension is None or cfg.extends_layer(index) or cfg.layer_type(index) != "sliding_attention":
        return scheme
    return PositionMapped(scheme, Windowed(inner=Unmapped(), window=cfg.sliding_window))


__all__ = ["build_schemes", "layer_scheme", "local_stack", "mapped_layer_scheme"]
