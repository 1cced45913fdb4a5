"""The RoPE scalings `posenc extend` compares, as Hugging Face `rope_scaling` dicts, and how a
length-dependent scaling is held fixed for one sequence.

Every preset is built from the model's rotary dims and base, the trained context and one
factor, so every method extends by the same amount. Attention temperatures are the ones each
method defines and the library computes from the dict: YaRN's sqrt(1/t) = 0.1 ln(s) + 1
(Peng et al. 2023, eq. 22) and LongRoPE's sqrt(1 + ln(s) / ln(L_train)) (Ding et al. 2024);
linear, NTK, dynamic NTK and Llama 3 define none.

Held frequencies. `dynamic` and `longrope` pick their frequencies from the current length.
Hugging Face derives them from the highest position of each call (dynamic: only when it exceeds
the longest length seen so far, resetting below the trained length, so results depend on what
ran before; longrope: per call), while keys already in the cache keep the rotation of an older
length (the mismatch YaRN's paper warns about for dynamic scaling, section 3.3). A chunked
prefill would then rotate each chunk differently from a one-call forward. posenc instead holds
one table per sequence: `held(scaling, L)` is the static dict whose frequencies equal the
length-dependent ones at L for every position, so a prompt of L tokens prefilled in any number
of chunks and then decoded through the cache sees exactly what one HF forward of those L tokens
sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc.experiments.rope_presets import PRESETS, Target, longrope_long_factors
from posenc.rotary.scaling import SEQ_LEN_DEPENDENT, rope_type

__all__ = ["HOLDERS", "PRESETS", "Target", "held", "longrope_long_factors"]  # the presets live in rope_presets


def _hold_dynamic(scaling: Mapping[str, Any], length: int, trained: int) -> dict[str, Any]:
    # Dynamic NTK at L is the static NTK base change with stretch f L / L_train - (f - 1), never below 1.
    factor = float(scaling["factor"])
    return {"rope_type": "ntk", "factor": factor * max(length, trained) / trained - (factor - 1)}


def _hold_longrope(scaling: Mapping[str, Any], length: int, trained: int) -> dict[str, Any]:
    context = scaling.get("original_max_position_embeddings", trained)
    chosen = scaling["long_factor"] if length > context else scaling["short_factor"]
    return {**scaling, "short_factor": list(chosen), "long_factor": list(chosen)}


# rope_type -> its static equivalent at one length; one entry per type in SEQ_LEN_DEPENDENT (tested).
HOLDERS: dict[str, Callable[[Mapping[str, Any], int, int], dict[str, Any]]] = {
    "dynamic": _hold_dynamic,
    "longrope": _hold_longrope,
}


def held(scaling: Mapping[str, Any] | None, length: int, trained: int) -> dict[str, Any] | None:
    """The rope_scaling whose frequencies at every position equal `scaling`'s for a `length`-token
    sequence (the scaling itself when it does not depend on length)."""
    kind = rope_type(scaling)
    if kind not in SEQ_LEN_DEPENDENT:
        return None if scaling is None else dict(scaling)
    return HOLDERS[kind](scaling, length, trained)
