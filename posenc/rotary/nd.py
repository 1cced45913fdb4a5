"""N-d RoPE for grids (2-D images, 3-D volumes): axial rotary embedding.

Each head's R/2 rotary pairs are split among the n axes (as evenly as possible); the pairs
of axis a rotate by that axis' coordinate p_a times their own RoPE spectrum
theta_j = base^(-2j/R_a) (RoPE-Axial, Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer", eq. 8-9; Su's 2-D RoPE blog post). Since every pair's angle is linear in a
single coordinate, q_p . k_p' depends only on the offset p - p' along every axis.
With one axis this is exactly RoPE.

Positions are (B, T, n_axes) integer coordinates; (B, T) is accepted when n_axes == 1.
Not registered as a GPT scheme: GPT positions are 1-D. It is a `Scheme`, so SelfAttention
and the KV cache (which store positions as given) run it unchanged with grid positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.rotary._core import apply_rotary, inv_frequencies
from posenc.rotary.rope import RotaryOptions, rotary_dims
from posenc.scheme import Dims, Scheme


def axis_pairs(n_pairs: int, n_axes: int) -> list[int]:
    """Split n_pairs rotary pairs among n_axes axes, earlier axes taking the remainder."""
    if isinstance(n_axes, bool) or not isinstance(n_axes, int) or not 1 <= n_axes <= n_pairs:
        raise bad_value("n_axes", n_axes, f"an integer in [1, {n_pairs}] (one rotary pair per axis at least)")
    return [n_pairs // n_axes + (a < n_pairs % n_axes) for a in range(n_axes)]


def nd_inv_frequencies(rot_dim: int, base: float, n_axes: int) -> list[Tensor]:
    """One RoPE spectrum per axis, each over its own 2 * pairs dims: [(pairs_a,) float32]."""
    return [inv_frequencies(2 * pairs, base) for pairs in axis_pairs(rot_dim // 2, n_axes)]


def nd_angles(pos: Tensor, inv_freqs: list[Tensor]) -> Tensor:
    """pos (B,T,A) x A spectra -> angles (B,T,R/2) float64, axis a's pairs in the a-th block."""
    if pos.dim() == 2:
        pos = pos.unsqueeze(-1)  # (B,T) -> (B,T,1): one axis
    if pos.shape[-1] != len(inv_freqs):
        raise bad_value("positions.shape", tuple(pos.shape), f"(batch, length, {len(inv_freqs)}) grid coordinates")
    coords = pos.to(torch.float64)
    parts = [coords[..., a, None] * f.to(coords.device, torch.float64) for a, f in enumerate(inv_freqs)]
    return torch.cat(parts, dim=-1)  # (B,T,R/2)


@dataclass(frozen=True, kw_only=True)
class NdRoPEOptions(RotaryOptions):
    n_axes: int = 2  # grid axes: 2 for images, 3 for volumes; 1 is RoPE

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("seq_len_interpolation_factor", "rope_scaling"):  # the message names the one given
            if getattr(self, field) is not None:
                raise bad_value(field, getattr(self, field), "None for N-d RoPE (scalings are 1-D)")


class NdRoPE(Scheme):
    Options = NdRoPEOptions
    shift_invariant = True

    def __init__(self, dims: Dims, options: NdRoPEOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        o = self.options
        self.rot_dim = rotary_dims(dims.head_dim, o.rotary_percentage)
        self.n_axes, self.rotary_base, self.interleaved = o.n_axes, float(o.rotary_base), bool(o.rotary_interleaved)
        for a, freq in enumerate(nd_inv_frequencies(self.rot_dim, self.rotary_base, self.n_axes)):
            self.register_buffer(f"inv_freq_{a}", freq, persistent=False)
        self.exact_buffers = tuple(f"inv_freq_{a}" for a in range(self.n_axes))  # float32 under .to(bfloat16)

    def inv_freqs(self) -> list[Tensor]:
        return [getattr(self, f"inv_freq_{a}") for a in range(self.n_axes)]

    def tables(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """(B,T,A) coordinates -> cos, sin (B,1,T,R/2) float32."""
        theta = nd_angles(pos, self.inv_freqs())
        return theta.cos().to(torch.float32).unsqueeze(1), theta.sin().to(torch.float32).unsqueeze(1)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cq, sq = self.tables(q_pos)
        ck, sk = (cq, sq) if k_pos is q_pos else self.tables(k_pos)
        return apply_rotary(q, cq, sq, self.interleaved), apply_rotary(k, ck, sk, self.interleaved)

    def extra_repr(self) -> str:
        return f"n_axes={self.n_axes}, rot_dim={self.rot_dim}, base={self.rotary_base:g}"
