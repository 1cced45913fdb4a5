"""GPTConfig: a frozen dataclass with NeMo/Megatron field names, validated on construction.

The positional scheme is `position_embedding_type`; its options are accepted flat (NeMo names such as
rotary_percentage, rotary_base, seq_len_interpolation_factor, kerple_kernel) and owned by the scheme's
own Options dataclass (see scheme_config.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posenc.errors import bad_value
from posenc.models.attention_extension import check_position_map
from posenc.models.random_positions import check_randomized_positions
from posenc.models.scheme_config import SchemeConfig
from posenc.registry import scheme_class
from posenc.scheme import Dims
from posenc.validators import number_in, positive_int


def check_extension(cfg: Any) -> None:
    """attention_extension: a known method with valid options, on a scheme it can remap (rotary, causal)."""
    name = cfg.position_embedding_type
    check_position_map(cfg.attention_extension, name, scheme_class(name), cfg.dims(), cfg.options)
    if cfg.attention_extension is not None:
        object.__setattr__(cfg, "attention_extension", dict(cfg.attention_extension))


def check_shapes(cfg: Any) -> None:
    """Fields every model config shares: sizes, heads, GQA, the init scale."""
    for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
        positive_int(name, getattr(cfg, name))
    if cfg.d_model % cfg.n_head:
        raise bad_value("n_head", cfg.n_head, f"a divisor of d_model={cfg.d_model}")
    if cfg.n_kv_head is not None:
        positive_int("n_kv_head", cfg.n_kv_head)
        if cfg.n_head % cfg.n_kv_head:
            raise bad_value("n_kv_head", cfg.n_kv_head, f"a divisor of n_head={cfg.n_head}")
    if cfg.ffn_hidden_size is not None:
        positive_int("ffn_hidden_size", cfg.ffn_hidden_size)


@dataclass(frozen=True, kw_only=True, init=False)
class GPTConfig(SchemeConfig):
    vocab_size: int = 256  # bytes
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    max_seq_len: int = 1024  # learned_absolute's table size; relative schemes run past it
    position_embedding_type: str = "learned_absolute"  # NeMo's default
    n_kv_head: int | None = None  # None: = n_head (no GQA)
    ffn_hidden_size: int | None = None  # None: 4 * d_model
    dropout: float = 0.0
    bias: bool = False  # no biases in linears/norms: fewer params, same quality (nanoGPT note)
    tie_word_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02
    randomized_positions: bool = False  # Ruoss et al. 2023: train on sorted random positions from [0, L)
    max_random_position: int | None = None  # their L; None: 4 * max_seq_len
    extra: dict[str, Any] = field(default_factory=dict)  # room for experiment notes; unused by the model
    attention_extension: dict[str, Any] | None = None  # a position map (posenc.position_maps), e.g. Self-Extend

    def __post_init__(self) -> None:
        check_shapes(self)
        number_in("dropout", self.dropout, 0.0, 1.0, high_open=True)
        number_in("init_std", self.init_std, 0.0, math.inf, low_open=True, high_open=True)
        number_in("norm_eps", self.norm_eps, 0.0, 1.0, low_open=True)
        check_randomized_positions(self.randomized_positions, self.max_random_position, self.max_seq_len)
        self.check_scheme("position_embedding_type", self.dims())
        check_extension(self)

    def dims(self) -> Dims:
        limit = self.random_position_range
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.max_seq_len, True,
                    self.n_kv_head or self.n_head, self.init_std, None if limit is None else limit - 1)

    @property
    def options(self) -> Any:
        """The chosen scheme's Options instance."""
        return self.scheme_options("position_embedding_type")

    @property
    def random_position_range(self) -> int | None:
        """L of randomized positions when they are on (training samples positions from [0, L)), else None."""
        if not self.randomized_positions:
            return None
        return self.max_random_position or 4 * self.max_seq_len
