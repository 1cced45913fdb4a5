"""Bias family: schemes that add to the attention logits."""

from posenc.bias.alibi import alibi_slopes
from posenc.bias.sandwich import sandwich_table
from posenc.bias.t5 import t5_relative_position_bucket

__all__ = ["alibi_slopes", "sandwich_table", "t5_relative_position_bucket"]
