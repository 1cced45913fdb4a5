"""RoPE context-extension scalings as pure transforms of the frequency vector.

Keyed by Hugging Face's `rope_type`, taking HF's `rope_scaling` dict unchanged, so
configs of real models load as they are. Each entry maps
(inv_freq, scaling dict, context) -> (inv_freq, attention_scaling).
Bad values are ValueErrors, never warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from posenc.errors import bad_value, unknown_name
from posenc.rotary._core import inv_frequencies


@dataclass(frozen=True)
class ScalingContext:
    head_dim: int  # rotated dims R
    base: float
    max_position_embeddings: int | None
    seq_len: int | None  # current length, for schemes that adapt to it (dynamic)


Scaling = Callable[[Tensor, Mapping[str, Any], ScalingContext], tuple[Tensor, float]]


def _positive_factor(scaling: Mapping[str, Any]) -> float:
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1.0:
        raise bad_value("rope_scaling.factor", factor, "a number >= 1.0")
    return float(factor)


def _default(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    return inv_freq, 1.0


def _linear(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    # Position interpolation (Chen et al. 2023): positions / factor == frequencies / factor.
    return inv_freq / _positive_factor(scaling), 1.0


ROPE_SCALINGS: dict[str, Scaling] = {
    "default": _default,
    "linear": _linear,
}

# rope_types whose frequencies change with the current sequence length.
SEQ_LEN_DEPENDENT: set[str] = set()


def rope_type(scaling: Mapping[str, Any] | None) -> str:
    if scaling is None:
        return "default"
    if not isinstance(scaling, Mapping):
        raise bad_value("rope_scaling", scaling, "a dict like {'rope_type': 'linear', 'factor': 2.0}")
    name = scaling.get("rope_type", scaling.get("type", "default"))
    if name not in ROPE_SCALINGS:
        raise unknown_name("rope_scaling.rope_type", name, ROPE_SCALINGS)
    return name


def frequencies(
    head_dim: int,
    base: float,
    scaling: Mapping[str, Any] | None = None,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """Inverse frequencies (head_dim/2,) float32 and the attention scaling for a rope_scaling dict."""
    if head_dim <= 0 or head_dim % 2:
        raise bad_value("head_dim", head_dim, "a positive even number of rotated dims")
    if base <= 1.0:
        raise bad_value("rotary_base", base, "a number > 1")
    name = rope_type(scaling)
    ctx = ScalingContext(head_dim, float(base), max_position_embeddings, seq_len)
    return ROPE_SCALINGS[name](inv_frequencies(head_dim, base), scaling or {}, ctx)
