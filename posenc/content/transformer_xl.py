"""`transformer_xl`: relative attention of Transformer-XL (Dai et al. 2019, sec. 3.3, eq. before 3.4).

  A_ij = q_i.k_j  +  q_i.W_R R_{i-j}  +  u.k_j  +  v.W_R R_{i-j}
          (a)          (b)                 (c)        (d)
R is the fixed sinusoid of the distance i - j (d_model wide), W_R a learned projection to
the heads, u and v learned per-head vectors. SDPA computes (a) scaled by 1/sqrt(Dh); this
scheme returns (b) + (c) + (d) with the same scaling, so all four terms share it as in the paper.

(b) + (d) = (q_i + v).W_R R_{i-j}: one matmul against the L distinct distances present
(B,H,Tq,L), then a gather at each pair's distance. The paper's "relative shift" (pad,
reshape, slice) produces the same matrix, but only for contiguous positions with queries
at the end of the keys; the gather reads the explicit position tensors instead, so shifted
positions, cached decoding (Tq < Tk) and any position layout need no special case.

per_layer=True: the paper gives each layer its own W_R; u and v are shared across layers in
the paper but untied per layer by default in the reference code's successors (HF untie_r=True);
we keep one instance per layer so a layer owns all its positional parameters.
Causal only (supports_bidirectional=False): TXL is a decoder, and its segment recurrence
(not implemented here: our KV cache plays that role at inference) assumes the past.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posenc.absolute.sinusoidal import sinusoidal_table
from posenc.nn.kept_tables import kept_span
from posenc.nn.triangular import triangular_rows
from posenc.scheme import Dims, RelativeRows, RelativeTable, Scheme, cast


class TransformerXL(Scheme):
    shift_invariant = True
    per_layer = True
    supports_bidirectional = False

    def __init__(self, dims: Dims, options: Any = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        h, dh = dims.n_head, dims.head_dim
        self.w_r = nn.Linear(dims.d_model, h * dh, bias=False)  # W_{k,R}
        nn.init.normal_(self.w_r.weight, std=0.02)
        self.u = nn.Parameter(torch.randn(h, dh) * 0.02)  # content bias, term (c)
        self.v = nn.Parameter(torch.randn(h, dh) * 0.02)  # position bias, term (d)

    def projected_distances(self, low: int, high: int, like: Tensor) -> Tensor:
        """W_R R_r for r = low..high -> (H, L, Dh), L = high - low + 1."""
        offsets = torch.arange(low, high + 1, device=like.device)  # (L,)
        r = sinusoidal_table(offsets, self.dims.d_model).to(self.w_r.weight.dtype)  # (L,D), computed in float64
        projected = self.w_r(r).to(like.dtype)  # in W_R's dtype: bf16 tensors on a float32 scheme (no autocast)
        return projected.view(-1, self.dims.n_head, self.dims.head_dim).transpose(0, 1)  # (H,L,Dh)

    def projected_by_offset(self, low: int, high: int, like: Tensor) -> Tensor:
        """W_R R_{i-j} for r = n - m = low..high (distance i - j = -r) -> (H, L, Dh), kept across calls when no
        gradient reaches W_R: a decode step asks for one more offset than the last, and projecting all of them
        again cost 5x the step. Kept in r's order over a range that doubles, so a step's rows come out in key
        order (no flip per layer)."""
        if torch.is_grad_enabled() and self.w_r.weight.requires_grad:
            return self.projected_distances(-high, -low, like).flip(1)
        return kept_span(self, ("projected", like.dtype, like.device), low, high,
                         lambda first, last: self.projected_distances(-last, -first, like).flip(1).contiguous(), dim=1)

    def content_bias(self, k: Tensor) -> Tensor:
        """Term (c), u.k_j: k (B,Hkv,Tk,Dh) -> (B,H,1,Tk); GQA query head h reads key head h // group."""
        b, hkv, tk, dh = k.shape
        u = self.u.to(k.dtype).view(hkv, -1, dh)  # (Hkv,group,Dh)
        return torch.einsum("bktd,kgd->bkgt", k, u).reshape(b, -1, 1, tk)  # (B,H,1,Tk)

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        if q is None or k is None:
            raise ValueError("transformer_xl: bias() needs q and k (terms b, c, d); attention passes them")
        distance = q_pos[:, :, None] - k_pos[:, None, :]  # (B,Tq,Tk), i - j
        low, high = int(distance.min()), int(distance.max())
        rk = self.projected_distances(low, high, q)  # (H,L,Dh)
        per_distance = (q + self.v.to(q.dtype)[:, None, :]) @ rk.transpose(-1, -2)  # (B,H,Tq,L): (b)+(d)
        index = (distance - low).unsqueeze(1).expand(q.shape[0], q.shape[1], -1, -1)  # (B,H,Tq,Tk)
        position = per_distance.gather(-1, index)  # (B,H,Tq,Tk)
        return (position + self.content_bias(k)) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)

    def relative_rows(self, q: Tensor, low: int, high: int) -> RelativeRows:
        """(b) + (d) as rows at r = n - m in [low, high] (distance i - j = -r), scaled; (c) as q_shift = u."""
        rk = self.projected_by_offset(low, high, q)  # (H,L,Dh) for r = low..high
        scaled = (q + cast(self.v, q.dtype)[:, None, :]) * q.shape[-1] ** -0.5  # (B,H,Tq,Dh): scale before the matmul
        if q.shape[0] * q.shape[2] < q.shape[3]:  # few queries (decoding): every row in full
            rows = scaled @ rk.transpose(-1, -2)
        else:
            rows = triangular_rows(scaled, rk)
        return RelativeRows(rows, low, q_shift=cast(self.u, q.dtype))  # rows (B,H,Tq,L) for r = low..high

    def relative_table(self, low: int, high: int, like: Tensor) -> RelativeTable:
        """relative_rows before the product with q: W_R R_{i-j} per head for r = n - m = low..high (distance
        i - j = -r, hence the flip), and the shifts v (rows) and u (content)."""
        rk = self.projected_by_offset(low, high, like)  # (H,L,Dh) for r = low..high, a view of the kept span
        return RelativeTable(rk, low, self.dims.head_dim**-0.5, row_shift=self.v, q_shift=self.u)

    def extra_repr(self) -> str:
        return f"heads={self.dims.n_head}, head_dim={self.dims.head_dim}"


__all__ = ["TransformerXL"]
