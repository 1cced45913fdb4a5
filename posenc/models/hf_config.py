"""A Hugging Face config.json of the Llama family <-> LlamaConfig fields.

Reads transformers 5's layout (rope_parameters, per layer type for Gemma 3; layer_types) and 4's (rope_theta,
rope_scaling, rope_local_base_freq, sliding_window_pattern, use_sliding_window). Anything posenc would compute
differently from transformers is refused in one line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.models.families import Family, family_of_model_type
from posenc.rotary.scaling import SCALING_KEYS, rope_type

_REFUSED = {"mlp_bias": (None, False), "use_bidirectional_attention": (None, False)}


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise bad_value("path", str(directory), "a Hugging Face checkpoint folder holding config.json")
    hf = json.loads(path.read_text())
    family_of_model_type(hf.get("model_type"))
    for key, allowed in _REFUSED.items():
        if hf.get(key) not in allowed:
            raise bad_value(f"config.json {key}", hf[key], f"one of {allowed[1:]} (posenc's decoders have no other)")
    return hf


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """rotary_base, rotary_percentage, rope_scaling and local_rotary_base from either layout."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    local_theta, layers = hf.get("rope_local_base_freq"), None
    if "full_attention" in params or "sliding_attention" in params:  # per layer type (Gemma 3, transformers 5)
        local = dict(params.get("sliding_attention") or {})
        params = dict(params.get("full_attention") or {})
        local_theta = local.pop("rope_theta", local_theta)
        full = {k: v for k, v in params.items() if k != "rope_theta"}
        if rope_type(local) != "default" and local != full:
            raise bad_value("config.json rope_parameters.sliding_attention", local,
                            f"a default rope, or the full-attention layers' scaling ({full})")
        layers = "all" if rope_type(local) != "default" else None  # the scaling acts on every layer
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    percentage = float(params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    kind = rope_type(params)
    original = hf.get("original_max_position_embeddings")  # Phi-3 keeps it beside the scaling
    if kind != "default" and original is not None and "original_max_position_embeddings" in SCALING_KEYS[kind]:
        params.setdefault("original_max_position_embeddings", original)
    return {"rotary_base": theta, "rotary_percentage": percentage,
            "rope_scaling": params if kind != "default" else None,
            "local_rotary_base": None if local_theta is None else float(local_theta), "extension_layers": layers}


def _windows(hf: dict[str, Any], entry: Family, n_layer: int) -> dict[str, Any]:
    """sliding_window and layer_types as transformers derives them."""
    window = None if hf.get("use_sliding_window") is False else hf.get("sliding_window")
    types = hf.get("layer_types")
    if window is None:
        return {"sliding_window": None, "layer_types": None}
    if types is None:
        pattern = hf.get("sliding_window_pattern", entry.sliding_pattern)
        if pattern:  # every pattern-th layer global (Gemma)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layer)]
        elif hf.get("use_sliding_window"):  # Qwen: the layers from max_window_layers on
            first = int(hf.get("max_window_layers", 0))
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layer)]
    return {"sliding_window": int(window), "layer_types": None if types is None else tuple(types)}


def config_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """LlamaConfig fields from an HF config.json dict."""
    entry = family_of_model_type(hf.get("model_type", "llama"))
    n_head, d_model, n_layer = int(hf["num_attention_heads"]), int(hf["hidden_size"]), int(hf["num_hidden_layers"])
    head_dim = hf.get("head_dim") or d_model // n_head
    return {
        "family": entry.name, "vocab_size": int(hf["vocab_size"]), "n_layer": n_layer, "n_head": n_head,
        "n_kv_head": int(hf.get("num_key_value_heads") or n_head), "d_model": d_model,
        "head_dim": None if head_dim * n_head == d_model else int(head_dim),
        "ffn_hidden_size": int(hf["intermediate_size"]), "max_seq_len": int(hf["max_position_embeddings"]),
        "hidden_act": hf.get(entry.activation_key) or hf.get("hidden_act") or "silu",
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)), "rotary_interleaved": False,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "attention_bias": bool(hf.get("attention_bias", False)),
        "attn_logit_softcapping": hf.get("attn_logit_softcapping"),
        "final_logit_softcapping": hf.get("final_logit_softcapping"),
        "query_pre_attn_scalar": hf.get("query_pre_attn_scalar"),
        **_rope(hf), **_windows(hf, entry, n_layer),
    }


def hf_config(cfg: Any) -> dict[str, Any]:
    """The config.json transformers' own class of cfg.family reads back to the same model."""
    entry = cfg.entry
    if cfg.rotary_interleaved and cfg.rotary_percentage != 1.0:
        raise bad_value("rotary_percentage", cfg.rotary_percentage, "1.0 for a GGUF-paired model saved to HF")
    rope: dict[str, Any] = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rotary_base}
    if cfg.rotary_percentage != 1.0:
        rope["partial_rotary_factor"] = cfg.rotary_percentage
    scaled_everywhere = cfg.extension_layers == "all" and cfg.rope_scaling is not None
    if cfg.local_rotary_base is not None:  # per layer type: the sliding layers scaled where extension_layers says
        local = {**rope, "rope_theta": cfg.local_rotary_base} if scaled_everywhere else {
            "rope_type": "default", "rope_theta": cfg.local_rotary_base}
        rope = {"full_attention": rope, "sliding_attention": local}
    elif cfg.rope_scaling is not None and cfg.extension_layers != "all" and "sliding_attention" in [
            cfg.layer_type(i) for i in range(cfg.n_layer)]:
        raise bad_value("extension_layers", cfg.extension_layers, f"all with a rope_scaling and sliding layers: "
                        f"transformers' {entry.architecture} scales every layer")
    out = {
        "architectures": [entry.architecture], "model_type": entry.model_types[0], entry.activation_key: cfg.hidden_act,
        "vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head, "hidden_size": cfg.d_model,
        "head_dim": cfg.head_size, "intermediate_size": cfg.ffn_hidden_size, "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias, "mlp_bias": False, "dtype": "float32",
        "sliding_window": cfg.sliding_window, "use_sliding_window": cfg.sliding_window is not None,
        "attn_logit_softcapping": cfg.attn_logit_softcapping, "final_logit_softcapping": cfg.final_logit_softcapping,
    }
    kinds = [cfg.layer_type(i) for i in range(cfg.n_layer)]
    if len(set(kinds)) > 1:  # mixed; all-sliding is sliding_window alone (Mistral warns at layer_types)
        out["layer_types"], out["max_window_layers"] = kinds, 0
    out["query_pre_attn_scalar"] = cfg.query_pre_attn_scalar or cfg.head_size  # Gemma's default would be 256
    return out


__all__ = ["config_fields", "hf_config", "read_config"]
