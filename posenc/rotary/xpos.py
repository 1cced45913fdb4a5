"""`xpos`: RoPE with an exponential per-pair decay (Sun et al. 2022, "A Length-Extrapolatable
Transformer", eq. 9-10).

Pair i gets zeta_i = (2i + 0.4 R) / (1.4 R); queries are multiplied by zeta_i^(m/scale_base)
and keys divided by zeta_i^(n/scale_base), so q_m . k_n carries zeta_i^((m-n)/scale_base):
relative, but decaying with distance. NeMo's scale_base default is 2048; the paper used 512.
Pairs are adjacent dims (x[2i], x[2i+1]) by default, as NeMo and the paper's code rotate them.

A plain zeta**(n/scale_base) overflows float32 past n ~ 36k at scale_base 512. Two guards:
the `frame` hook measures positions from the sequence's first token (exact, since the score
depends only on m - n), so an offset of 1e6 costs nothing; and the scale is computed in log
space with its exponent clamped to +-XPOS_MAX_LOG, so nothing can overflow even within one very
long sequence. The result is exact while position * |log zeta_0| /
scale_base < XPOS_MAX_LOG, i.e. for sequences up to ~32 * scale_base tokens (16k at 512, 65k at
2048); past that the clamp keeps every value finite but distant-pair factors are approximate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.inference_tensors import position_version
from posenc.nn.kept_tables import kept
from posenc.rotary import rope
from posenc.rotary._core import angles, apply_rotary, rotate_pair
from posenc.rotary.rope import TABLE_CAP, RoPE, RotaryOptions, gather_rows
from posenc.scheme import Dims, RotationTables, expanded_row, from_first_key, shared_row_extremes
from posenc.validators import number_in

XPOS_MAX_LOG = 40.0  # e^40 ~ 2e17: q and k scales multiply to at most e^80 < float32 max e^88


def xpos_log_zeta(rot_dim: int) -> Tensor:
    """log zeta_i, i = 0..R/2-1, float64 (R/2,)."""
    i = torch.arange(0, rot_dim, 2, dtype=torch.float64)
    return torch.log((i + 0.4 * rot_dim) / (1.4 * rot_dim))


def xpos_tables(pos: Tensor, inv_freq: Tensor, log_zeta: Tensor, scale_base: float, sign: float):
    """cos, sin (B,1,T,R/2) float32 already multiplied by zeta^(sign * pos / scale_base)."""
    theta = angles(pos, inv_freq)
    log_scale = (sign * pos.to(torch.float64)[..., None] / scale_base) * log_zeta.to(pos.device)
    scale = log_scale.clamp(-XPOS_MAX_LOG, XPOS_MAX_LOG).exp()
    cos = (theta.cos() * scale).to(torch.float32).unsqueeze(1)
    sin = (theta.sin() * scale).to(torch.float32).unsqueeze(1)
    return cos, sin


def xpos_exact_span(rot_dim: int, scale_base: float) -> float:
    """Largest position (from the origin) at which the clamped scale is still exact."""
    return XPOS_MAX_LOG * scale_base / float(-xpos_log_zeta(rot_dim)[0])


@dataclass(frozen=True, kw_only=True)
class XPosOptions(RotaryOptions):
    xpos_scale_base: float = 2048.0  # NeMo's default; the paper used 512

    def __post_init__(self) -> None:
        super().__post_init__()
        number_in("xpos_scale_base", self.xpos_scale_base, 0.0, float("inf"), low_open=True)


class XPos(RoPE):
    Options = XPosOptions
    exact_buffers = ("inv_freq", "log_zeta")
    shift_invariant = True  # up to the documented per-pair scale, which depends on m - n only
    # In an encoder, future keys (m - n < 0) would be amplified by zeta^(m-n) > 1, not decayed.
    supports_bidirectional = False
    # NeMo's XPOSPositionEmbedding rotates adjacent pairs (x[2i], x[2i+1]) (rotate_every_two and
    # duplicate_interleave), as the paper's torchscale code does. Half-split pairs give the same
    # scores up to a permutation of each head's dims, but trained q/k weights carry over only with
    # the pairing they were trained with; rotary_interleaved=False selects half-split.
    default_interleaved = True

    def __init__(self, dims: Dims, options: XPosOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.scale_base = float(self.options.xpos_scale_base)
        self.register_buffer("log_zeta", xpos_log_zeta(self.rot_dim), persistent=False)

    def frame(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return from_first_key(q_pos, k_pos)  # keeps zeta^(n/scale_base) in range at any offset

    def _tables(self, pos: Tensor, sign: float) -> tuple[Tensor, Tensor]:
        """Per-forward memo, one entry per side (+1 queries, -1 keys), shared by all layers. Rows come from a
        per-position table per side (as RoPE's: built once, grown by doubling), so a decode step gathers one row
        instead of evaluating the float64 formula."""
        if torch.compiler.is_compiling():  # traced: the formula, which the compiler fuses
            return xpos_tables(expanded_row(pos), self.inv_freq, self.log_zeta, self.scale_base, sign)
        memo = self._memo if isinstance(self._memo, dict) else {}
        hit = memo.get(sign)
        if hit is not None and hit[0] is pos and hit[1] == position_version(pos):
            return hit[2]
        row, lowest, highest = shared_row_extremes(pos)  # (b,T), b = 1 when every row holds the same positions
        if highest < TABLE_CAP and lowest >= 0:
            tables = tuple(gather_rows(t, row, highest) for t in self._side_table(sign, highest + 1, row.device))
        else:  # beyond the cap: these rows directly, still in float64
            tables = xpos_tables(row, self.inv_freq, self.log_zeta, self.scale_base, sign)
        self.__dict__["_memo"] = {**memo, sign: (pos, position_version(pos), tables)}  # (not nn.Module's __setattr__)
        return tables

    def _side_table(self, sign: float, needed: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin (N, R/2) of positions 0..N-1 for one side, N >= needed; kept while the scheme's buffers are
        unchanged (kept_tables)."""
        def build() -> tuple[Tensor, Tensor]:
            size = min(TABLE_CAP, max(rope.TABLE_MIN, 1 << (needed - 1).bit_length()))
            cos, sin = xpos_tables(torch.arange(size, device=device)[None], self.inv_freq.to(device),
                                   self.log_zeta.to(device), self.scale_base, sign)
            return cos[0, 0], sin[0, 0]  # (N, R/2) float32

        return kept(self, ("side rows", sign, device), lambda table: table[0].shape[0] >= needed, build)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cq, sq = self._tables(q_pos, +1.0)
        ck, sk = self._tables(k_pos, -1.0)
        if k_pos is q_pos and q.shape[-2] == 1 and q.dtype == k.dtype:  # a decode step: one call, not two
            return rotate_pair(q, k, cq, sq, self.interleaved, ck, sk)  # views of one (B,H+Hkv,1,Dh)
        return apply_rotary(q, cq, sq, self.interleaved), apply_rotary(k, ck, sk, self.interleaved)

    def rotation_tables(self, q_pos: Tensor, k_pos: Tensor) -> RotationTables:
        """Queries' tables scaled by zeta^(m/scale_base), keys' by zeta^(-n/scale_base), as rotate() applies them."""
        return RotationTables(*self._tables(q_pos, +1.0), *self._tables(k_pos, -1.0), self.interleaved)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale_base={self.scale_base:g}"
