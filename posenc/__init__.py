"""posenc: positional encodings for transformers, behind one switch."""

from posenc.errors import ConfigError
from posenc.nn.functional import attention
from posenc.registry import available, build, register
from posenc.scheme import Dims, Scheme

__version__ = "0.1.0"
__all__ = ["ConfigError", "Dims", "Scheme", "attention", "available", "build", "register"]
