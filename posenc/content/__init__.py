"""Content-relative family: schemes whose positional term needs q (and k or the weights)."""

from posenc.content.shaw import Shaw
from posenc.content.transformer_xl import TransformerXL

__all__ = ["Shaw", "TransformerXL"]
