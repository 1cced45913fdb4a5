"""GGUF metadata of the Llama family -> LlamaConfig fields. llama.cpp prefixes each key with the architecture
(`qwen2.context_length`); what a file leaves out, llama.cpp assumes per architecture, and so do we from the
family's entry (the sliding pattern, Gemma 3's local theta, the MLP's gate). RoPE scalings: `rope.scaling.type`
linear or yarn, and Phi-3's LongRoPE, whose per-pair factors are tensors (rope_factors_long/short)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from posenc.errors import bad_value
from posenc.models.families import Family

_MISSING = object()
FACTOR_TENSORS = {"rope_factors_long.weight": "long_factor", "rope_factors_short.weight": "short_factor"}


def _scaling(get: Callable[..., Any], factors: dict[str, Tensor]) -> dict[str, Any] | None:
    if factors:  # LongRoPE (Phi-3): the factors as tensors, the rest as metadata
        out = {"rope_type": "longrope", **{FACTOR_TENSORS[n]: t.tolist() for n, t in factors.items()},
               "original_max_position_embeddings": int(get("rope.scaling.original_context_length"))}
        attention = get("rope.scaling.attn_factor", None)
        return out if attention is None else {**out, "attention_factor": float(attention)}
    kind = get("rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": float(get("rope.scaling.factor")),
                "original_max_position_embeddings": int(get("rope.scaling.original_context_length"))}
    raise bad_value("gguf rope.scaling.type", kind, "none, linear or yarn (or Phi-3's rope_factors tensors)")


def _layer_types(get: Callable[..., Any], entry: Family, n_layer: int) -> tuple[str, ...] | None:
    pattern = get("attention.sliding_window_pattern", entry.sliding_pattern)
    if isinstance(pattern, (list, tuple)):  # one flag per layer: True = sliding
        return tuple("sliding_attention" if p else "full_attention" for p in pattern)
    if pattern:  # every pattern-th layer global, as llama.cpp's set_swa_pattern
        return tuple("sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(n_layer))
    return None  # every layer slides


def gguf_fields(meta: dict[str, Any], entry: Family, vocab_size: int, factors: dict[str, Tensor]) -> dict[str, Any]:
    """LlamaConfig fields from a GGUF's metadata (metadata()), its family's entry and its LongRoPE factors."""

    def get(name: str, default: Any = _MISSING) -> Any:
        key = f"{entry.gguf_arch}.{name}"
        if key in meta:
            return meta[key]
        if default is _MISSING:
            raise bad_value(f"gguf {key}", None, f"present (llama.cpp writes it for {entry.gguf_arch})")
        return default

    n_head, d_model, n_layer = int(get("attention.head_count")), int(get("embedding_length")), int(get("block_count"))
    head_dim = int(get("attention.key_length", d_model // n_head))
    window = get("attention.sliding_window", None)
    layer_types = _layer_types(get, entry, n_layer) if window else None
    sliding = window is not None and (layer_types is None or "sliding_attention" in layer_types)
    local = get("rope.freq_base_swa", entry.gguf_local_base) if sliding else None
    return {
        "family": entry.name, "vocab_size": vocab_size, "n_layer": n_layer, "n_head": n_head,
        "n_kv_head": int(get("attention.head_count_kv", n_head)), "d_model": d_model,
        "head_dim": None if head_dim * n_head == d_model else head_dim,
        "ffn_hidden_size": int(get("feed_forward_length")),
        "hidden_act": entry.activation, "max_seq_len": int(get("context_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rotary_base": float(get("rope.freq_base", 10000.0)),
        "rotary_percentage": int(get("rope.dimension_count", head_dim)) / head_dim,
        "rotary_interleaved": entry.gguf_interleaved,  # see gguf.py
        "attn_logit_softcapping": get("attn_logit_softcapping", None),
        "final_logit_softcapping": get("final_logit_softcapping", None),
        "sliding_window": None if window is None else int(window), "layer_types": layer_types,
        "local_rotary_base": None if local is None else float(local), "rope_scaling": _scaling(get, factors),
    }


__all__ = ["FACTOR_TENSORS", "gguf_fields"]
