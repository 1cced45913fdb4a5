"""T5Config: an encoder-decoder whose two stacks pick their positional schemes separately; the
schemes' options are flat and shared, as in NeMo's T5 config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posenc.errors import bad_value
from posenc.models.config import check_shapes
from posenc.models.scheme_config import SchemeConfig
from posenc.registry import available, scheme_class
from posenc.scheme import Dims
from posenc.validators import number_in, positive_int


def schemes_for(causal: bool) -> list[str]:
    """Registered names a causal (decoder) or bidirectional (encoder) stack can take."""
    return [name for name in available()
            if (scheme_class(name).supports_causal if causal else scheme_class(name).supports_bidirectional)]


@dataclass(frozen=True, kw_only=True, init=False)
class T5Config(SchemeConfig):
    SCHEME_FIELDS = ("encoder_position_embedding_type", "decoder_position_embedding_type")

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
        check_shapes(self)
        if self.n_decoder_layer is not None:
            positive_int("n_decoder_layer", self.n_decoder_layer)
        number_in("dropout", self.dropout, 0.0, 1.0, high_open=True)
        number_in("init_std", self.init_std, 0.0, math.inf, low_open=True, high_open=True)
        number_in("norm_eps", self.norm_eps, 0.0, 1.0, low_open=True)
        for scheme_field, stack, dims in (("encoder_position_embedding_type", "encoder", self.encoder_dims()),
                                          ("decoder_position_embedding_type", "decoder", self.decoder_dims())):
            name = getattr(self, scheme_field)
            scheme_class(name, scheme_field)
            if name not in schemes_for(dims.causal):
                kind = "causal" if dims.causal else "bidirectional"
                raise bad_value(scheme_field, name, f"{name} cannot serve the {stack} ({kind} attention); the "
                                                    f"{stack} allows: {', '.join(schemes_for(dims.causal))}")
            self.check_scheme(scheme_field, dims)

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layer or self.n_layer

    def _dims(self, causal: bool) -> Dims:
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.max_seq_len, causal,
                    self.n_kv_head or self.n_head, self.init_std)

    def encoder_dims(self) -> Dims:
        return self._dims(causal=False)

    def decoder_dims(self) -> Dims:
        return self._dims(causal=True)


__all__ = ["T5Config", "schemes_for"]
