"""The model of an extend run: load it (GGUF or HF folder, plain RoPE only) and set a RoPE scaling
held at one length (scalings.held), keyed by the frequency table it computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.scalings import Target, held
from posenc.models.llama import Llama
from posenc.rotary.scaling import frequencies


def target(model: Llama, cfg: ExtendConfig) -> Target:
    rope = model.schemes.layer(0)
    return Target(cfg.scaling_factor(model.cfg.max_seq_len), model.cfg.max_seq_len, rope.rot_dim, rope.rotary_base)


def use_scaling(model: Llama, scaling: dict[str, Any] | None, length: int) -> Llama:
    """Set `scaling`, held at `length` (scalings.held): one table for the whole sequence."""
    return model.set_rope_scaling(held(scaling, length, model.cfg.max_seq_len))


def frequency_key(model: Llama, scaling: dict[str, Any] | None, length: int) -> tuple:
    """What RoPE computes for a `length`-token sequence under `scaling`: equal keys, equal logits."""
    rope = model.schemes.layer(0)
    inv_freq, scale = frequencies(rope.rot_dim, rope.rotary_base, scaling, model.cfg.max_seq_len, length)
    return tuple(inv_freq.tolist()), scale


def load_model(cfg: ExtendConfig) -> Llama:
    """The built-in GGUF, a user's GGUF file, or a user's HF checkpoint folder."""
    from posenc.models.gguf import builtin_smollm2_path

    path = Path(cfg.model.path) if cfg.model.path else builtin_smollm2_path()
    model = Llama.from_hf(path) if path.is_dir() else Llama.from_gguf(path)
    if model.cfg.rope_scaling is not None:
        raise bad_value("model", str(path), "a checkpoint without its own rope_scaling (extend compares "
                        f"scalings of plain RoPE; this one has {model.cfg.rope_scaling})")
    if model.cfg.position_embedding_type != "rope":
        raise bad_value("model", str(path), "a RoPE model")
    return model


def model_name(cfg: ExtendConfig, model: Llama) -> str:
    return (model.gguf_path or model.hf_path or Path(cfg.model.path or "model")).name
