"""apply / remove: posenc's rope_scaling and position maps inside a loaded transformers model (see __init__)."""

from __future__ import annotations

from typing import Any

from torch import nn

from posenc.errors import bad_value
from posenc.hf.attention import NAME, register
from posenc.hf.rotary import IdentityRotary, PosencRotary
from posenc.models.hf_config import config_fields
from posenc.models.layer_schemes import build_schemes, mapped_layer_scheme
from posenc.models.llama_config import LlamaConfig

_STATE = "_posenc_state"
_ABSENT = object()


def posenc_config(model: Any, rope_scaling: dict[str, Any] | None, attention_extension: dict[str, Any] | None,
                  extension_layers: str | None = None) -> LlamaConfig:
    """The LlamaConfig of posenc's decoder for this transformers model under the method (validated here, so
    bad options fail before the model is touched). rope_scaling None keeps the checkpoint's own."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise bad_value("model", type(model).__name__, "a transformers PreTrainedModel of a posenc family")
    fields = config_fields(config.to_dict())
    if rope_scaling is not None:
        fields["rope_scaling"] = None if rope_scaling.get("rope_type", "default") == "default" else rope_scaling
    fields["extension_layers"] = extension_layers or fields.get("extension_layers")
    return LlamaConfig(**fields, attention_extension=attention_extension)


def _named(model: nn.Module, suffix: str) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) for each submodule whose name ends with `suffix`."""
    out = []
    for name, module in model.named_modules():
        if name.endswith(suffix):
            parent, _, child = name.rpartition(".")
            out.append((model.get_submodule(parent), child, module))
    return out


def apply(model: Any, rope_scaling: dict[str, Any] | None = None, attention_extension: dict[str, Any] | None = None,
          extension_layers: str | None = None) -> Any:
    """Put a rope_scaling (HF's dict; None keeps the model's own) and/or a position map (posenc.position_maps'
    dict) into a loaded transformers model of a posenc family, in place; returns the model. extension_layers:
    the layers they act on (LlamaConfig's: all, global; None: the family's). A second apply replaces the first."""
    cfg = posenc_config(model, rope_scaling, attention_extension, extension_layers)
    rotaries, attentions = _named(model, "rotary_emb"), _named(model, "self_attn")
    if not rotaries or len(attentions) != cfg.n_layer:
        raise bad_value("model", type(model).__name__, "a causal LM with one rotary_emb and a self_attn per layer")
    schemes, local = build_schemes(cfg)
    if attention_extension is None and local is not None and cfg.local_rotary_base is None:
        # transformers gives these families one rotary table for every layer (Gemma 3 one per layer type)
        raise bad_value("extension_layers", cfg.extension_layers, f"all for a rope_scaling alone on "
                        f"{type(model).__name__} (one rotary table for every layer), or together with a map")
    remove(model)
    if attention_extension is None:
        by_type = {"full_attention": schemes.layer(0)}
        if local is not None:
            by_type["sliding_attention"] = local.layer(0)
        replacement: nn.Module = PosencRotary(by_type)
    else:
        replacement = IdentityRotary(round(cfg.head_size * cfg.rotary_percentage))
        register()
        for i, (_, _, attention) in enumerate(attentions):
            attention.posenc_scheme = mapped_layer_scheme(cfg, schemes, local, i)
    state = {"rotary": [(parent, child, module) for parent, child, module in rotaries], "config": cfg,
             "attn_implementation": model.config._attn_implementation,
             "layer_types": model.config.__dict__.get("layer_types", _ABSENT)}
    for parent, child, _ in rotaries:
        setattr(parent, child, replacement)
    if attention_extension is not None:
        model.set_attn_implementation(NAME)
        # The map holds the sliding layers' windows (position_maps/window.py), and maps read each sequence's
        # first position (LM-Infinite's global keys, sinks): the cache must keep every key, as posenc's does,
        # not only the last window (transformers' sliding cache layers, chosen from config.layer_types).
        model.config.layer_types = ["full_attention"] * cfg.n_layer
    object.__setattr__(model, _STATE, state)
    return model


def remove(model: Any) -> Any:
    """Undo apply (nothing if it was not applied); returns the model."""
    state = getattr(model, _STATE, None)
    if state is None:
        return model
    for parent, child, module in state["rotary"]:
        setattr(parent, child, module)
    for _, _, attention in _named(model, "self_attn"):
        if "posenc_scheme" in attention._modules:
            del attention.posenc_scheme
    if model.config._attn_implementation != state["attn_implementation"]:
        model.set_attn_implementation(state["attn_implementation"])
    if state["layer_types"] is _ABSENT:
        model.config.__dict__.pop("layer_types", None)
    else:
        model.config.layer_types = state["layer_types"]
    object.__delattr__(model, _STATE)
    return model


def applied(model: Any) -> LlamaConfig | None:
    """The posenc config in force (its rope_scaling and attention_extension), or None."""
    state = getattr(model, _STATE, None)
    return None if state is None else state["config"]


__all__ = ["applied", "apply", "remove"]
