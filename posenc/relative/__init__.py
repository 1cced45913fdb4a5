"""Content-relative family: schemes whose positional term needs q (and k or the weights)."""

from posenc.relative.shaw import Shaw
from posenc.relative.transformer_xl import TransformerXL

__all__ = ["Shaw", "TransformerXL"]
