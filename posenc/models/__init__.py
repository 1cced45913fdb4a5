"""Models whose positional scheme is chosen by name."""

from posenc.models.config import GPTConfig
from posenc.models.gpt import GPT
from posenc.models.llama import Llama, LlamaConfig
from posenc.models.t5 import T5
from posenc.models.t5_config import T5Config

__all__ = ["GPT", "T5", "GPTConfig", "Llama", "LlamaConfig", "T5Config"]
