"""Bias family: schemes that add to the attention logits."""

from posenc.bias.alibi import alibi_slopes
from posenc.bias.sandwich import sandwich_table

__all__ = ["alibi_slopes", "sandwich_table"]
