"""Models whose positional scheme is chosen by name."""

from posenc.models.config import GPTConfig
from posenc.models.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
