"""The model of an extend run: load it (GGUF or HF folder, plain RoPE only) and set one method (methods.py):
its RoPE scaling held at one length (scalings.held) and its attention position map, keyed by what they
compute, so two rows that compute the same thing at a length share one forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.methods import Method, build_method
from posenc.experiments.extend.scalings import Target, held
from posenc.models.llama import Llama
from posenc.rotary.scaling import frequencies


def rope_of(model: Llama) -> Any:
    """Layer 0's rotary scheme, under its position map when one is set."""
    layer = model.schemes.layer(0)
    return getattr(layer, "inner", layer)


def attention_scaling(model: Llama) -> float:
    return rope_of(model).attention_scaling


def target(model: Llama, cfg: ExtendConfig) -> Target:
    rope = rope_of(model)
    return Target(cfg.scaling_factor(model.cfg.max_seq_len), model.cfg.max_seq_len, rope.rot_dim, rope.rotary_base)


def sweep_methods(model: Llama, cfg: ExtendConfig) -> list[Method]:
    """The rows of the run, in the order asked, for this model and factor."""
    t = target(model, cfg)
    return [build_method(name, t, cfg.extend.method_options) for name in cfg.extend.methods]


def use_method(model: Llama, method: Method, length: int) -> Llama:
    """Set the method for a `length`-token sequence: its scaling held there (one table for the whole
    sequence) and its map where the map changes anything. The loaded weights stay; only the schemes are
    rebuilt, once, for the pair."""
    return model.set_method(held(method.rope_scaling, length, model.cfg.max_seq_len), method.extension_at(length))


def plain_model(model: Llama) -> Llama:
    return model.set_method(None, None)


def computation_key(model: Llama, method: Method, length: int) -> tuple:
    """What the method computes for a `length`-token sequence: equal keys, equal logits (and a longer forward's
    prefix serves a shorter length of the same key; not under a map whose scores scale with the length)."""
    extension = method.extension_at(length)
    mapped = None if extension is None else repr(sorted(extension.items()))
    if extension is not None and method.length_scaled:
        mapped = (mapped, length)
    return frequency_key(model, method.rope_scaling, length), mapped


def frequency_key(model: Llama, scaling: dict[str, Any] | None, length: int) -> tuple:
    """What RoPE computes for a `length`-token sequence under `scaling`: equal keys, equal logits."""
    rope = rope_of(model)
    inv_freq, scale = frequencies(rope.rot_dim, rope.rotary_base, scaling, model.cfg.max_seq_len, length)
    return tuple(inv_freq.tolist()), scale


def check_methods(model: Llama, cfg: ExtendConfig) -> None:
    """Every method on this model's family, before any forward: a map it cannot carry (Gemma 2's soft-capped
    attention) is one line naming the method, not an error minutes into the sweep."""
    for method in sweep_methods(model, cfg):
        if method.extension is None:
            continue
        try:
            model.cfg.replace(attention_extension=method.extension)
        except ValueError as err:
            raise bad_value("extend.methods", method.name, f"methods this {model.cfg.family} model can run ({err})") \
                from None


def load_model(cfg: ExtendConfig) -> Llama:
    """The built-in GGUF, a user's GGUF file, or a user's HF checkpoint folder of any family
    (posenc.models.families): its trained context, head dim, rope base and scaling read from the checkpoint."""
    from posenc.models.builtin import model_file
    from posenc.models.gguf import builtin_smollm2_path

    path = model_file(cfg.model.path) if cfg.model.path else builtin_smollm2_path()
    if cfg.model.backend == "transformers":
        from posenc.experiments.extend.transformers_model import TransformersModel

        model = TransformersModel.load(path)
    else:
        model = Llama.from_hf(path) if path.is_dir() else Llama.from_gguf(path)
    if model.cfg.rope_scaling is not None:
        raise bad_value("model", str(path), "a checkpoint without its own rope_scaling (extend compares "
                        f"scalings of plain RoPE; this one has {model.cfg.rope_scaling})")
    if model.cfg.position_embedding_type != "rope":
        raise bad_value("model", str(path), "a RoPE model")
    if cfg.model.extension_layers is not None:  # no scaling or map yet: the stacks need no rebuild
        try:
            model.cfg = model.cfg.replace(extension_layers=cfg.model.extension_layers)
        except ValueError as err:
            raise bad_value("model.extension_layers", cfg.model.extension_layers,
                            f"a choice this model takes ({err})") from None
    check_methods(model, cfg)
    return model


def model_name(cfg: ExtendConfig, model: Llama) -> str:
    return (model.gguf_path or model.hf_path or Path(cfg.model.path or "model")).name
