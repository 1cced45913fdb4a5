"""`rope`: rotary position embedding (Su et al. 2021) with NeMo's options.

rotary_percentage rotates only the first fraction of each head's dims (GPT-NeoX);
rotary_base sets theta; seq_len_interpolation_factor is position interpolation
(Chen et al. 2023: positions / factor), and rope_scaling takes HF's dict for
the other context-extension methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.inference_tensors import position_version
from posenc.nn.kept_tables import kept
from posenc.rotary._core import apply_rotary, cos_sin, rotate_pair
from posenc.rotary.scaling import SEQ_LEN_DEPENDENT, frequencies, rope_type
from posenc.scheme import Dims, RotationTables, Scheme, expanded_row, shared_row_extremes
from posenc.validators import number_in, optional_number_at_least


def rotary_dims(head_dim: int, rotary_percentage: float) -> int:
    rot = head_dim * rotary_percentage
    if not 0.0 < rotary_percentage <= 1.0:
        raise bad_value("rotary_percentage", rotary_percentage, "a fraction in (0, 1]")
    if rot != int(rot) or int(rot) % 2:
        raise bad_value(
            "rotary_percentage",
            rotary_percentage,
            f"head_dim {head_dim} x rotary_percentage must be an even whole number of dims, got {rot:g}",
        )
    return int(rot)


def scaling_from_config(options: Any) -> dict[str, Any] | None:
    """NeMo's seq_len_interpolation_factor is HF's linear scaling; both at once is ambiguous."""
    factor = getattr(options, "seq_len_interpolation_factor", None)
    scaling = getattr(options, "rope_scaling", None)
    if factor is not None and scaling is not None:
        raise bad_value("seq_len_interpolation_factor", factor, "None when rope_scaling is also set")
    if factor is not None:
        return {"rope_type": "linear", "factor": float(factor)}
    return dict(scaling) if scaling is not None else None


@dataclass(frozen=True, kw_only=True)
class RotaryOptions:
    """NeMo's rotary options (and HF's rope_scaling), shared by every rotary scheme."""

    rotary_percentage: float = 1.0  # NeMo: fraction of each head's dims that rotate
    rotary_base: float = 10000.0
    rotary_interleaved: bool | None = None  # None: the scheme's NeMo pairing (rope half-split, xpos adjacent)
    seq_len_interpolation_factor: float | None = None  # PI: positions / factor
    rope_scaling: dict[str, Any] | None = None  # HF format, e.g. {"rope_type": "yarn", "factor": 4.0}

    def __post_init__(self) -> None:
        number_in("rotary_percentage", self.rotary_percentage, 0.0, 1.0, low_open=True)
        number_in("rotary_base", self.rotary_base, 1.0, float("inf"), low_open=True)
        if self.rotary_interleaved is not None and not isinstance(self.rotary_interleaved, bool):
            raise bad_value("rotary_interleaved", self.rotary_interleaved, "None, True or False")
        optional_number_at_least("seq_len_interpolation_factor", self.seq_len_interpolation_factor, 1.0,
                                 "None or a number >= 1 (positions are divided by it)")
        rope_type(self.rope_scaling)  # a mapping with a known rope_type; its values are checked with the dims
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        scaling_from_config(self)


def gather_rows(table: Tensor, pos: Tensor, highest: int) -> Tensor:
    """table (N, R/2) rows at positions pos (b,T) whose largest is highest -> (b,1,T,R/2); one position (a decode
    step) is a view of its row."""
    if pos.numel() == 1:
        return table.narrow(0, highest, 1).view(1, 1, 1, -1)
    return table.index_select(0, pos.reshape(-1)).view(pos.shape[0], 1, pos.shape[1], table.shape[-1])


TABLE_CAP = 1 << 17  # positions with a cached cos/sin row (~32 MB at R=64); beyond: computed per call
TABLE_MIN = 4096  # rows of the first table: most runs never grow it


class RoPE(Scheme):
    Options = RotaryOptions
    shift_invariant = True
    exact_buffers = ("inv_freq",)  # the angles' frequencies stay float32 under model.to(bfloat16)
    # Pairing when the config leaves rotary_interleaved unset: Megatron-core's and NeMo's RoPE
    # rotate half-split pairs (rotate_half), as GPT-NeoX and HF Llama do.
    default_interleaved: ClassVar[bool] = False

    def __init__(self, dims: Dims, options: RotaryOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        o = self.options
        self.rot_dim = rotary_dims(dims.head_dim, o.rotary_percentage)
        self.rotary_base = float(o.rotary_base)
        self.interleaved = self.default_interleaved if o.rotary_interleaved is None else o.rotary_interleaved
        self.rope_scaling = scaling_from_config(o)
        self._dynamic = rope_type(self.rope_scaling) in SEQ_LEN_DEPENDENT
        inv_freq, self.attention_scaling = self._frequencies(None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._memo: tuple | None = None  # (pos, version, cos, sin): one table per forward, shared by layers

    @classmethod
    def check_config(cls, dims: Dims, options: RotaryOptions) -> None:
        rot_dim = rotary_dims(dims.head_dim, options.rotary_percentage)
        # every rope_scaling value, checked against the rotated dims (e.g. LongRoPE's per-pair factors)
        frequencies(rot_dim, float(options.rotary_base), scaling_from_config(options), dims.max_seq_len, None)

    def _frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        return frequencies(
            self.rot_dim, self.rotary_base, self.rope_scaling, self.dims.max_seq_len, seq_len
        )

    def tables(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B,1,T,R/2) for positions (B,T). Rows come from a per-position table built once
        (grown by doubling) and gathered by position id; the gathered pair is remembered for the
        rest of the forward, so all layers share it."""
        if torch.compiler.is_compiling() and not self._dynamic:  # traced: the formula, which the compiler fuses
            return cos_sin(expanded_row(pos), self.inv_freq.to(pos.device), self.attention_scaling)
        memo = self._memo
        if memo is not None and memo[0] is pos and memo[1] == position_version(pos):
            return memo[2], memo[3]
        key = pos
        pos, lowest, highest = shared_row_extremes(key)  # (b,T), b = 1 when every row holds the same positions
        if self._dynamic:  # frequencies depend on the current length: no reusable table
            inv_freq, scale = self._frequencies(highest + 1)
            cos, sin = cos_sin(pos, inv_freq.to(pos.device), scale)
        elif highest < TABLE_CAP and lowest >= 0:
            cos, sin = (gather_rows(table, pos, highest) for table in self._position_table(highest + 1, pos.device))
        else:  # beyond the cap (e.g. a 1e6 offset): compute these rows directly, still in float64
            cos, sin = cos_sin(pos, self.inv_freq.to(pos.device), self.attention_scaling)
        self.__dict__["_memo"] = (key, position_version(key), cos, sin)  # (nn.Module's __setattr__ checks ~10 things)
        return cos, sin

    def _position_table(self, needed: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin (N, R/2) float32 of positions 0..N-1, N >= needed, grown by doubling; kept while the scheme's
        buffers are unchanged (kept_tables: a frequency patch made in place, .half(), a new inv_freq)."""
        def build() -> tuple[Tensor, Tensor]:
            size = min(TABLE_CAP, max(TABLE_MIN, 1 << (needed - 1).bit_length()))
            positions = torch.arange(size, device=device)[None]  # (1,N)
            cos, sin = cos_sin(positions, self.inv_freq.to(device), self.attention_scaling)
            return cos[0, 0], sin[0, 0]

        return kept(self, ("rows", device), lambda table: table[0].shape[0] >= needed, build)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cq, sq = self.tables(q_pos)
        if k_pos is q_pos and q.shape[-2] == 1 and q.dtype == k.dtype:  # a decode step: one call, not two
            return rotate_pair(q, k, cq, sq, self.interleaved)  # views of one (B,H+Hkv,1,Dh)
        ck, sk = (cq, sq) if k_pos is q_pos else self.tables(k_pos)
        return apply_rotary(q, cq, sq, self.interleaved), apply_rotary(k, ck, sk, self.interleaved)

    def rotation_tables(self, q_pos: Tensor, k_pos: Tensor) -> RotationTables:
        """The tables rotate() applies: one pair for both sides, so keys at q_pos share the queries' tables."""
        cq, sq = self.tables(q_pos)
        ck, sk = (cq, sq) if k_pos is q_pos else self.tables(k_pos)
        return RotationTables(cq, sq, ck, sk, self.interleaved)

    def extra_repr(self) -> str:
        return (f"rot_dim={self.rot_dim}, base={self.rotary_base:g}, interleaved={self.interleaved}, "
                f"scaling={self.rope_scaling}")

