"""`shaw`: relative position representations (Shaw, Uszkoreit & Vaswani 2018, eq. 3-5).

  e_mn = q_m . (k_n + a^K_mn) / sqrt(Dh)          (eq. 4)
  z_m  = sum_n w_mn (v_n + a^V_mn)                 (eq. 3)
  a^K_mn = P_K[clip(n - m, -k, k) + k],  a^V_mn = P_V[same]   (eq. 5)
P_K, P_V are (2k+1, Dh) tables shared across heads (sec. 3.3) and owned by each layer.

The paper's (Tq, Tk, Dh) tensors of a_mn are never built. Only 2k+1 distinct vectors exist,
so the key term is q @ P_K^T (B,H,Tq,2k+1) gathered at each pair's clipped distance, and the
value term scatter-adds the weights into 2k+1 distance buckets before one (2k+1, Dh) matmul.
Both depend only on n - m, so cached decoding works from the stored key positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from posenc.errors import bad_value
from posenc.scheme import Dims, RelativeRows, RelativeTable, Scheme, cast


def check_max_relative_position(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_value("shaw_max_relative_position", value, "a positive integer (the clipping distance k)")


def clipped_index(q_pos: Tensor, k_pos: Tensor, max_relative_position: int) -> Tensor:
    """(B,Tq), (B,Tk) -> clip(n - m, -k, k) + k as (B,1,Tq,Tk) int64, a row of the (2k+1) tables."""
    distance = k_pos[:, None, :] - q_pos[:, :, None]  # (B,Tq,Tk)
    k = max_relative_position
    return (distance.clamp(-k, k) + k).unsqueeze(1)  # (B,1,Tq,Tk)


@dataclass(frozen=True, kw_only=True)
class ShawOptions:
    shaw_max_relative_position: int = 16  # the clipping k (Shaw et al. 2018 found k >= 2 enough)

    def __post_init__(self) -> None:
        check_max_relative_position(self.shaw_max_relative_position)


class Shaw(Scheme):
    Options = ShawOptions
    shift_invariant = True
    per_layer = True
    needs_weights = True

    def __init__(self, dims: Dims, options: ShawOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.max_relative_position = self.options.shaw_max_relative_position
        rows = 2 * self.max_relative_position + 1
        # Small random tables (the paper does not give an init); 0.02 as the model's linears.
        self.key_table = nn.Parameter(torch.randn(rows, dims.head_dim) * 0.02)  # P_K (2k+1,Dh)
        self.value_table = nn.Parameter(torch.randn(rows, dims.head_dim) * 0.02)  # P_V (2k+1,Dh)

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        """Key term of eq. 4: q_m . a^K_mn / sqrt(Dh), (B,H,Tq,Tk)."""
        if q is None:
            raise ValueError("shaw: bias() needs q (its key term is q . a^K); attention passes it")
        per_distance = q @ self.key_table.to(q.dtype).T  # (B,H,Tq,2k+1)
        index = clipped_index(q_pos, k_pos, self.max_relative_position)  # (B,1,Tq,Tk)
        index = index.expand(q.shape[0], q.shape[1], -1, -1)  # (B,H,Tq,Tk), a view
        return per_distance.gather(-1, index) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)

    def relative_rows(self, q: Tensor, low: int, high: int) -> RelativeRows:
        """Both terms as rows at clip(n - m, -k, k): q . a^K (B,H,Tq,2k+1) scaled, and P_V for the values."""
        # F.linear: q . a^K as one call (a decode step makes this in every layer; .T and @ were two more)
        rows = F.linear(q, cast(self.key_table, q.dtype)) * q.shape[-1] ** -0.5  # (B,H,Tq,2k+1)
        return RelativeRows(rows, -self.max_relative_position, cast(self.value_table, q.dtype))

    def relative_table(self, low: int, high: int, like: Tensor) -> RelativeTable:
        """relative_rows before the product with q: P_K for every head, scaled; P_V for the values."""
        return RelativeTable(self.key_table[None], -self.max_relative_position, self.dims.head_dim**-0.5,
                             values=self.value_table)

    def mix_values(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Value term of eq. 3: sum_n w_mn a^V_mn, (B,H,Tq,Dh)."""
        index = clipped_index(q_pos, k_pos, self.max_relative_position).expand_as(weights)  # (B,H,Tq,Tk)
        rows = self.value_table.shape[0]
        per_distance = weights.new_zeros(*weights.shape[:-1], rows)  # (B,H,Tq,2k+1)
        per_distance = per_distance.scatter_add(-1, index, weights)  # weight mass at each clipped distance
        return per_distance @ self.value_table.to(weights.dtype)  # (B,H,Tq,Dh)

    def extra_repr(self) -> str:
        return f"max_relative_position={self.max_relative_position}, head_dim={self.dims.head_dim}"


__all__ = ["Shaw", "clipped_index"]
