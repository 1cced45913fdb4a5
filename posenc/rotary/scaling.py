"""RoPE context-extension scalings as pure transforms of the frequency vector.

Keyed by Hugging Face's `rope_type`, taking HF's `rope_scaling` dict unchanged, so
configs of real models load as they are. Each entry maps
(inv_freq, scaling dict, context) -> (inv_freq, attention_scaling); attention_scaling
multiplies cos and sin, so logits are scaled by its square (YaRN's sqrt(1/t), eq. 22).
Bad values and unknown keys are ValueErrors, never warnings.

rope_type   method
default     RoPE (Su et al. 2021)
linear      position interpolation, theta_i / factor (Chen et al. 2023)
ntk         static NTK-aware base change, base * factor^(R/(R-2)) (bloc97, 2023). posenc's
            name: HF has no separate type for it (its `dynamic` is the length-adaptive form)
dynamic     dynamic NTK: the ntk base change with the factor grown from the current length
            (emozilla 2023); equal to default up to max_position_embeddings
yarn        NTK-by-parts + attention temperature (Peng et al. 2023, "YaRN", eq. 18-22)
llama3      Llama 3.1's wavelength-banded interpolation (Meta 2024)
longrope    per-pair rescale factors, short/long sets (Ding et al. 2024, "LongRoPE")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value, unknown_name
from posenc.rotary import scaling_fields as fields
from posenc.rotary._core import inv_frequencies


@dataclass(frozen=True)
class ScalingContext:
    head_dim: int  # rotated dims R
    base: float
    max_position_embeddings: int | None
    seq_len: int | None  # current length, for schemes that adapt to it (dynamic, longrope)


Scaling = Callable[[Tensor, Mapping[str, Any], ScalingContext], tuple[Tensor, float]]


def _default(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    return inv_freq, 1.0


def _linear(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    # Position interpolation (Chen et al. 2023): positions / factor == frequencies / factor.
    return inv_freq / fields.factor(scaling), 1.0


def _ntk_base(ctx: ScalingContext, stretch: float) -> float:
    # NTK-aware: raise the base so the lowest frequency stretches by `stretch` while the
    # highest (theta_0 = 1) is unchanged: base' = base * stretch^(R/(R-2)).
    if ctx.head_dim <= 2:
        raise bad_value("head_dim", ctx.head_dim, "more than 2 rotated dims for an NTK base change")
    return ctx.base * stretch ** (ctx.head_dim / (ctx.head_dim - 2))


def _ntk(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    return inv_frequencies(ctx.head_dim, _ntk_base(ctx, fields.factor(scaling))), 1.0


def _dynamic(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    factor, trained = fields.factor(scaling), ctx.max_position_embeddings
    if trained is None:
        raise bad_value("max_position_embeddings", None, "the trained context length, needed by rope_type='dynamic'")
    length = max(ctx.seq_len or trained, trained)
    # The stretch grows linearly from 1 at the trained length: factor * L / L_train - (factor - 1).
    return inv_frequencies(ctx.head_dim, _ntk_base(ctx, factor * length / trained - (factor - 1))), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (eq. 22), times DeepSeek's mscale."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention(scaling: Mapping[str, Any], factor: float) -> float:
    explicit = fields.number(scaling, "attention_factor", None, above=0.0, allowed="a number > 0")
    if explicit is not None:
        return explicit
    mscale = fields.number(scaling, "mscale", None, above=0.0, allowed="a number > 0")
    all_dim = fields.number(scaling, "mscale_all_dim", None, above=0.0, allowed="a number > 0")
    if (mscale is None) != (all_dim is None):  # HF silently ignores a lone one; we refuse to guess
        key = "mscale" if all_dim is None else "mscale_all_dim"
        raise bad_value(f"rope_scaling.{key}", scaling[key], "given together with its partner (mscale, mscale_all_dim)")
    if mscale is None:
        return yarn_mscale(factor)
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)


def yarn_ramp(rot_dim: int, base: float, context: int, beta_fast: float, beta_slow: float, truncate: bool) -> Tensor:
    """(R/2,) float32: 0 for pairs that turn more than beta_fast times over the context (kept),
    1 for pairs that turn fewer than beta_slow times (interpolated), linear between (eq. 18-19)."""

    def pair_index(turns: float) -> float:  # the pair that turns `turns` times over `context` tokens
        return rot_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001  # a step instead of a ramp, without dividing by zero
    return ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


def _yarn(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    factor = fields.factor(scaling)
    context = fields.context_length(scaling, ctx.max_position_embeddings, "yarn")
    beta_fast = fields.number(scaling, "beta_fast", 32.0, above=0.0, allowed="a number > 0 (paper: 32)")
    beta_slow = fields.number(scaling, "beta_slow", 1.0, above=0.0, allowed="a number > 0 (paper: 1)")
    if beta_fast <= beta_slow:
        raise bad_value("rope_scaling.beta_fast", beta_fast, f"a number > beta_slow={beta_slow:g}")
    ramp = yarn_ramp(ctx.head_dim, ctx.base, context, beta_fast, beta_slow, fields.flag(scaling, "truncate", True))
    interpolated = inv_freq * ramp / factor + inv_freq * (1 - ramp)
    return interpolated, _yarn_attention(scaling, factor)


def _llama3(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    factor = fields.factor(scaling)
    context = fields.context_length(scaling, ctx.max_position_embeddings, "llama3")
    low = fields.number(scaling, "low_freq_factor", above=0.0, allowed="a number > 0 (Llama 3.1: 1)")
    high = fields.number(scaling, "high_freq_factor", above=low, allowed=f"a number > low_freq_factor={low:g}")
    # Wavelengths longer than context/low are interpolated, shorter than context/high kept,
    # and in between blended by how many times the pair turns over the context.
    wavelen = 2 * math.pi / inv_freq
    blend = ((context / wavelen - low) / (high - low)).clamp(0, 1)  # 0 -> interpolate, 1 -> keep
    return inv_freq * blend + inv_freq / factor * (1 - blend), 1.0


def _longrope(inv_freq: Tensor, scaling: Mapping[str, Any], ctx: ScalingContext) -> tuple[Tensor, float]:
    context = fields.context_length(scaling, ctx.max_position_embeddings, "longrope")
    trained = ctx.max_position_embeddings
    factor = fields.number(scaling, "factor", None if trained is None else trained / context, at_least=1.0,
                           allowed="a number >= 1.0 (default: max_position_embeddings / original)")
    if factor is None:
        raise bad_value("rope_scaling.factor", None, "a number >= 1.0 when max_position_embeddings is unknown")
    default_attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(context))
    attention = fields.number(scaling, "attention_factor", default_attention, above=0.0, allowed="a number > 0")
    key = "long_factor" if ctx.seq_len is not None and ctx.seq_len > context else "short_factor"
    short = fields.per_pair_factors(scaling, "short_factor", ctx.head_dim // 2)
    long = fields.per_pair_factors(scaling, "long_factor", ctx.head_dim // 2)
    rescale = torch.tensor(long if key == "long_factor" else short, dtype=torch.float32)
    return inv_freq / rescale, attention


ROPE_SCALINGS: dict[str, Scaling] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}

# The keys each rope_type reads (besides rope_type/type/rope_theta); anything else is an error.
SCALING_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "ntk": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                       "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    "llama3": frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
    "longrope": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "short_factor",
                           "long_factor"}),
}

# rope_types whose frequencies change with the current sequence length.
SEQ_LEN_DEPENDENT: set[str] = {"dynamic", "longrope"}


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
    fields.check_keys(scaling or {}, name, SCALING_KEYS[name], float(base))
    ctx = ScalingContext(head_dim, float(base), max_position_embeddings, seq_len)
    return ROPE_SCALINGS[name](inv_frequencies(head_dim, base), scaling or {}, ctx)
