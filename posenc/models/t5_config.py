"""T5Config: an encoder-decoder whose two stacks pick their positional schemes separately."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posenc.errors import bad_value
from posenc.models.checks import number_in, positive_int
from posenc.models.config import PositionOptions
from posenc.registry import available, scheme_class
from posenc.scheme import Dims


def schemes_for(causal: bool) -> list[str]:
    """Registered names a causal (decoder) or bidirectional (encoder) stack can take."""
    return [name for name in available()
            if (scheme_class(name).supports_causal if causal else scheme_class(name).supports_bidirectional)]


def check_stack_scheme(field_name: str, name: str, stack: str, dims: Dims, cfg: Any) -> None:
    """Unknown name, or a scheme this stack cannot serve (e.g. transformer_xl in the encoder): ValueError."""
    cls = scheme_class(name, field_name)
    if name not in schemes_for(dims.causal):
        kind = "causal" if dims.causal else "bidirectional"
        raise bad_value(field_name, name,
                        f"{name} cannot serve the {stack} ({kind} attention); the {stack} allows: "
                        f"{', '.join(schemes_for(dims.causal))}")
    cls.check_config(dims, cfg)


@dataclass(frozen=True, kw_only=True)
class T5Config(PositionOptions):
    vocab_size: int = 256  # bytes
    n_layer: int = 4  # encoder layers (HF num_layers)
    n_decoder_layer: int | None = None  # None: = n_layer (HF num_decoder_layers)
    n_head: int = 4
    d_model: int = 128
    max_seq_len: int = 1024  # learned_absolute's table size, per stack
    encoder_position_embedding_type: str = "relative"  # T5's bucketed bias
    decoder_position_embedding_type: str = "relative"
    n_kv_head: int | None = None  # None: = n_head (no GQA)
    ffn_hidden_size: int | None = None  # None: 4 * d_model
    dropout: float = 0.0
    bias: bool = False  # T5 has no biases in linears or norms
    tie_word_embeddings: bool = True  # one table for encoder input, decoder input and output, as T5
    norm_eps: float = 1e-5
    init_std: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict)  # room for experiment notes; unused by the model

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            positive_int(name, getattr(self, name))
        for name in ("n_decoder_layer", "n_kv_head", "ffn_hidden_size"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if self.d_model % self.n_head:
            raise bad_value("n_head", self.n_head, f"a divisor of d_model={self.d_model}")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise bad_value("n_kv_head", self.n_kv_head, f"a divisor of n_head={self.n_head}")
        number_in("dropout", self.dropout, 0.0, 1.0, high_open=True)
        self.check_position_options()
        check_stack_scheme("encoder_position_embedding_type", self.encoder_position_embedding_type, "encoder",
                           self.encoder_dims(), self)
        check_stack_scheme("decoder_position_embedding_type", self.decoder_position_embedding_type, "decoder",
                           self.decoder_dims(), self)

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layer or self.n_layer

    def _dims(self, causal: bool) -> Dims:
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.max_seq_len, causal,
                    self.n_kv_head or self.n_head)

    def encoder_dims(self) -> Dims:
        return self._dims(causal=False)

    def decoder_dims(self) -> Dims:
        return self._dims(causal=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> T5Config:
        return dataclasses.replace(self, **changes)


__all__ = ["T5Config", "check_stack_scheme", "schemes_for"]
