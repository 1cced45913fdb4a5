"""LlamaConfig: the config of every Llama-family decoder (posenc.models.families), a frozen dataclass with
HF's field names where HF has one, validated on construction."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from posenc.errors import bad_value
from posenc.models.config import check_extension, check_shapes
from posenc.models.families import EXTENSION_LAYERS, Family, family
from posenc.models.scheme_config import SchemeConfig
from posenc.nn.llama_block import activation
from posenc.scheme import Dims
from posenc.validators import number_in, positive_int

LAYER_TYPES = ("full_attention", "sliding_attention")


def _optional_positive(name: str, value: Any) -> None:
    if value is not None:
        number_in(name, value, 0.0, math.inf, low_open=True, high_open=True)


@dataclass(frozen=True, kw_only=True, init=False)
class LlamaConfig(SchemeConfig):
    """Defaults are SmolLM2-135M's shapes; a GGUF file or an HF folder overrides every one."""

    family: str = "llama"  # an entry of posenc.models.families.FAMILIES: which norms, biases, names
    vocab_size: int = 49152
    n_layer: int = 30
    n_head: int = 9
    n_kv_head: int = 3  # GQA: each key/value head serves n_head // n_kv_head query heads
    d_model: int = 576
    head_dim: int | None = None  # None: d_model // n_head (Qwen3 and Gemma set their own)
    ffn_hidden_size: int = 1536
    hidden_act: str = "silu"  # the MLP's gate: silu (SwiGLU), gelu_pytorch_tanh (GeGLU: Gemma)
    max_seq_len: int = 8192  # the trained context: HF's max_position_embeddings, scalings' reference
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # biases on q, k, v and o (HF Llama's attention_bias)
    sliding_window: int | None = None  # "sliding_attention" layers attend to keys at distance < this
    layer_types: tuple[str, ...] | None = None  # per layer, LAYER_TYPES; None: all sliding iff sliding_window
    attn_logit_softcapping: float | None = None  # Gemma 2: scores -> c tanh(scores / c)
    final_logit_softcapping: float | None = None  # Gemma 2: logits -> c tanh(logits / c)
    query_pre_attn_scalar: float | None = None  # Gemma: scores scaled by this^-1/2; None: head_dim^-1/2
    local_rotary_base: float | None = None  # Gemma 3: sliding layers rotate with this theta and no rope_scaling
    position_embedding_type: str = "rope"
    attention_extension: dict[str, Any] | None = None  # a position map (posenc.position_maps), e.g. Self-Extend
    # The layers rope_scaling and attention_extension act on: all, or global (the full-attention layers; the
    # sliding ones keep their plain rope and window). None: the family's (global for Gemma 3, all otherwise)
    extension_layers: str | None = None

    def __post_init__(self) -> None:
        self.entry  # noqa: B018  (an unknown family is named first)
        check_shapes(self)
        if self.head_dim is not None:
            positive_int("head_dim", self.head_dim)
        activation(self.hidden_act)
        if self.sliding_window is not None:
            positive_int("sliding_window", self.sliding_window)
        self._check_layer_types()
        for name in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "local_rotary_base"):
            _optional_positive(name, getattr(self, name))
        if self.local_rotary_base is not None and not hasattr(self.options, "rotary_base"):
            raise bad_value("local_rotary_base", self.local_rotary_base,
                            f"None with position_embedding_type={self.position_embedding_type!r} (a rotary scheme's)")
        self.check_scheme("position_embedding_type", self.dims())
        check_extension(self)
        self._check_extension_layers()
        if self.attention_extension is not None and self.attn_logit_softcapping is not None:
            raise bad_value("attention_extension", self.attention_extension, "None with attn_logit_softcapping="
                            f"{self.attn_logit_softcapping} (the maps' attention has no soft-capping)")

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        kinds = tuple(self.layer_types)
        if len(kinds) != self.n_layer or any(k not in LAYER_TYPES for k in kinds):
            raise bad_value("layer_types", list(kinds), f"{self.n_layer} entries, each one of {LAYER_TYPES}")
        if "sliding_attention" in kinds and self.sliding_window is None:
            raise bad_value("sliding_window", None, "a window size when layer_types has sliding_attention layers")
        object.__setattr__(self, "layer_types", kinds)

    def _check_extension_layers(self) -> None:
        if self.extension_layers is None:
            object.__setattr__(self, "extension_layers", self.entry.extension_layers)
        if self.extension_layers not in EXTENSION_LAYERS:
            raise bad_value("extension_layers", self.extension_layers,
                            f"None (the family's) or one of {EXTENSION_LAYERS}")
        chosen = [i for i in range(self.n_layer) if self.extends_layer(i)]
        acting = self.attention_extension is not None or self.rope_scaling is not None or getattr(
            self, "seq_len_interpolation_factor", None) is not None
        if acting and not chosen:
            raise bad_value("extension_layers", self.extension_layers, "all on a model whose layers all slide (global "
                            "chooses the full-attention layers: none here, so the scaling or map would act nowhere)")

    def extends_layer(self, index: int) -> bool:
        """Whether rope_scaling and attention_extension act on layer `index` (extension_layers)."""
        return self.extension_layers == "all" or self.layer_type(index) == "full_attention"

    @property
    def entry(self) -> Family:
        return family(self.family)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.n_head

    def layer_type(self, index: int) -> str:
        if self.layer_types is not None:
            return self.layer_types[index]
        return "full_attention" if self.sliding_window is None else "sliding_attention"

    def dims(self) -> Dims:
        return Dims(self.d_model, self.n_head, self.head_size, self.max_seq_len, True, self.n_kv_head)

    @property
    def options(self) -> Any:
        return self.scheme_options("position_embedding_type")

    def local_options(self) -> Any:
        """The sliding layers' scheme options: their own theta where they have one (Gemma 3), and the scaling
        only where extension_layers chooses them."""
        options = self.options
        if self.local_rotary_base is not None:
            options = dataclasses.replace(options, rotary_base=self.local_rotary_base)
        if self.extension_layers != "all" and hasattr(options, "rope_scaling"):
            options = dataclasses.replace(options, rope_scaling=None, seq_len_interpolation_factor=None)
        return options


__all__ = ["LAYER_TYPES", "LlamaConfig"]
