"""Rotary family: schemes that rotate q and k in every layer."""

from posenc.rotary._core import apply_rotary, cos_sin, inv_frequencies
from posenc.rotary.nd import NdRoPE
from posenc.rotary.scaling import ROPE_SCALINGS, frequencies

__all__ = ["ROPE_SCALINGS", "NdRoPE", "apply_rotary", "cos_sin", "frequencies", "inv_frequencies"]
