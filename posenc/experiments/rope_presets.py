"""The RoPE scalings posenc's studies compare, once: each a Hugging Face `rope_scaling` dict built from the
model's rotary dims and base, the trained context and one factor, so every method extends by the same amount
(`posenc extend` compares them all on a pretrained model; `posenc finetune` fine-tunes with the static ones).
Attention temperatures are the ones each method defines and the library computes from the dict: YaRN's
sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22) and LongRoPE's sqrt(1 + ln(s) / ln(L_train)) (Ding et
al. 2024); linear (PI, Chen et al. 2023: NeMo's seq_len_interpolation_factor), NTK, dynamic NTK and Llama 3
define none. YaRN and Llama 3 take their papers' defaults (beta_fast 32, beta_slow 1; low/high frequency
factors 1 and 4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posenc.rotary.scaling import yarn_ramp


@dataclass(frozen=True)
class Target:
    """What a preset needs to know: the extension factor and the model's RoPE."""

    factor: float
    trained: int  # trained context: HF's (original_)max_position_embeddings
    rot_dim: int
    base: float


def longrope_long_factors(t: Target) -> list[float]:
    """Per-pair rescale factors (R/2,). LongRoPE finds them by an evolutionary search over
    perplexity at the target length, seeded with PI, NTK and YaRN; no searched factors exist for
    SmolLM2, so we use the YaRN seed: 1 for pairs that turn many times over the trained context,
    `factor` for the slowest pairs, YaRN's ramp between (its eq. 18-19)."""
    ramp = yarn_ramp(t.rot_dim, t.base, t.trained, beta_fast=32.0, beta_slow=1.0, truncate=True)
    return (1.0 / (ramp / t.factor + (1.0 - ramp))).tolist()


PRESETS: dict[str, Callable[[Target], dict[str, Any] | None]] = {
    "none": lambda t: None,
    "linear": lambda t: {"rope_type": "linear", "factor": t.factor},
    "ntk": lambda t: {"rope_type": "ntk", "factor": t.factor},
    "dynamic": lambda t: {"rope_type": "dynamic", "factor": t.factor},
    "yarn": lambda t: {"rope_type": "yarn", "factor": t.factor, "original_max_position_embeddings": t.trained},
    "llama3": lambda t: {"rope_type": "llama3", "factor": t.factor, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": t.trained},
    # short factors 1: inside the trained context LongRoPE is RoPE (times its attention factor).
    "longrope": lambda t: {"rope_type": "longrope", "factor": t.factor, "original_max_position_embeddings": t.trained,
                           "short_factor": [1.0] * (t.rot_dim // 2), "long_factor": longrope_long_factors(t)},
}
