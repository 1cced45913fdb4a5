"""Model configs: frozen dataclasses with NeMo/Megatron field names, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posenc.absolute.abacus import check_digit_ids
from posenc.bias.t5 import check_bucket_options
from posenc.errors import bad_value
from posenc.models.checks import non_negative_int, number_in, optional_number_at_least, positive_int
from posenc.models.random_positions import check_randomized_positions
from posenc.registry import scheme_class
from posenc.relative.shaw import check_max_relative_position
from posenc.scheme import Dims


@dataclass(frozen=True, kw_only=True)
class PositionOptions:
    """Scheme options shared by GPT and T5 (NeMo names; each scheme reads the ones it uses)."""

    rotary_percentage: float = 1.0  # NeMo: fraction of each head's dims that rotate
    rotary_base: float = 10000.0
    rotary_interleaved: bool | None = None  # None: the scheme's NeMo pairing (rope half-split, xpos adjacent)
    seq_len_interpolation_factor: float | None = None  # PI: positions / factor
    rope_scaling: dict[str, Any] | None = None  # HF format, e.g. {"rope_type": "yarn", "factor": 4.0}
    num_attention_heads_alibi: int | None = None  # NeMo: bias only the first heads
    kerple_kernel: str = "log"  # "log" (NeMo: -b log(1 + a|m-n|^p)) or "power" (-b |m-n|^p) (Chi et al. 2022)
    kerple_learn_p: bool = True  # log kernel: learn p as NeMo does; False keeps p = 1 (the paper's 2-parameter form)
    xpos_scale_base: float = 2048.0  # NeMo's default; the paper used 512
    relative_attention_num_buckets: int = 32  # T5 (HF name): buckets of the `relative` bias
    relative_attention_max_distance: int = 128  # T5: distances past this share the last bucket
    shaw_max_relative_position: int = 16  # Shaw et al. 2018's clipping k (they found k >= 2 enough)
    p_rope_fraction: float = 0.75  # p-RoPE: share of highest frequencies kept (Barbero et al. 2024)
    cope_npos_max: int = 64  # CoPE: rows of the position table; contextual positions clip at npos_max - 1
    fire_mlp_width: int = 32  # FIRE: hidden units of f_theta (Li et al. 2023 use 32)
    fire_init_c: float = 0.1  # FIRE: initial c of psi(x) = log(c x + 1) (the paper's init)
    fire_init_threshold: float = 512.0  # FIRE: initial L of psi(max(L, i)) (the paper's init)
    abacus_max_offset: int = 100  # Abacus: training offsets k in [0, this) (McLeish et al. 2024: 100)
    abacus_digit_ids: tuple[int, ...] = tuple(range(48, 58))  # Abacus: ids of '0'..'9' (bytes 48..57)
    shape_max_shift: int = 100  # SHAPE: training shifts k in [0, this] (Kiyono et al. 2021 use larger)

    def check_position_options(self) -> None:
        number_in("rotary_percentage", self.rotary_percentage, 0.0, 1.0, low_open=True)
        number_in("rotary_base", self.rotary_base, 1.0, float("inf"), low_open=True)
        optional_number_at_least("seq_len_interpolation_factor", self.seq_len_interpolation_factor, 1.0,
                                 "None or a number >= 1 (positions are divided by it)")
        number_in("xpos_scale_base", self.xpos_scale_base, 0.0, float("inf"), low_open=True)
        check_bucket_options(self.relative_attention_num_buckets, self.relative_attention_max_distance)
        check_max_relative_position(self.shaw_max_relative_position)
        positive_int("cope_npos_max", self.cope_npos_max)
        positive_int("fire_mlp_width", self.fire_mlp_width)
        number_in("fire_init_c", self.fire_init_c, 0.0, float("inf"), low_open=True, high_open=True)
        number_in("fire_init_threshold", self.fire_init_threshold, 0.0, float("inf"), low_open=True, high_open=True)
        positive_int("abacus_max_offset", self.abacus_max_offset)
        # YAML gives lists: store a tuple so configs compare equal after a save/load round trip.
        object.__setattr__(self, "abacus_digit_ids", check_digit_ids(self.abacus_digit_ids))
        non_negative_int("shape_max_shift", self.shape_max_shift)


@dataclass(frozen=True, kw_only=True)
class GPTConfig(PositionOptions):
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            positive_int(name, getattr(self, name))
        if self.d_model % self.n_head:
            raise bad_value("n_head", self.n_head, f"a divisor of d_model={self.d_model}")
        if self.n_kv_head is not None:
            positive_int("n_kv_head", self.n_kv_head)
            if self.n_head % self.n_kv_head:
                raise bad_value("n_kv_head", self.n_kv_head, f"a divisor of n_head={self.n_head}")
        if self.ffn_hidden_size is not None:
            positive_int("ffn_hidden_size", self.ffn_hidden_size)
        number_in("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_randomized_positions(self.randomized_positions, self.max_random_position, self.max_seq_len)
        self.check_position_options()
        scheme_class(self.position_embedding_type).check_config(self.dims(), self)

    def dims(self) -> Dims:
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.max_seq_len, True,
                    self.n_kv_head or self.n_head)

    @property
    def random_position_range(self) -> int | None:
        """L of randomized positions when they are on (training samples positions from [0, L)), else None."""
        if not self.randomized_positions:
            return None
        return self.max_random_position or 4 * self.max_seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> GPTConfig:
        return dataclasses.replace(self, **changes)
