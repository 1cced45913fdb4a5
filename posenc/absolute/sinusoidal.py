"""`sinusoidal`: fixed sin/cos position vectors added to embeddings (Vaswani et al. 2017, sec. 3.5).

PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
Computed from the explicit positions in float64, so any position works and no table limits length.

Scale: Vaswani et al. multiply token embeddings by sqrt(d) so tokens and positions are of similar
size. Our embeddings start at std init_std (0.02), so the sinusoid (per-dim RMS 1/sqrt(2)) is
multiplied by sqrt(2) * init_std instead: per-dim RMS equal to the tokens'. Unscaled, it buried the
tokens and a tiny GPT stayed at perplexity ~24 after 400 steps (make demo, before this change).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from posenc.nn.kept_tables import kept
from posenc.scheme import Dims, Scheme, cast, expanded_row, shared_row_extremes

TABLE_ELEMENTS = 1 << 22  # floats of the kept table at most (16 MiB): positions past it are computed per call
TABLE_MIN = 64  # rows of the first table


def sinusoidal_table(pos: Tensor, d: int, base: float = 10000.0) -> Tensor:
    """pos (...,) -> (..., d) float32: sin on even dims, cos on odd dims."""
    i = torch.arange(0, d, 2, dtype=torch.float64, device=pos.device)
    angle = pos.to(torch.float64)[..., None] / base ** (i / d)  # (..., ceil(d/2))
    out = torch.empty(*pos.shape, d, dtype=torch.float64, device=pos.device)
    out[..., 0::2] = angle.sin()
    out[..., 1::2] = angle.cos()[..., : d // 2]
    return out.to(torch.float32)


class Sinusoidal(Scheme):
    shift_invariant = False

    def __init__(self, dims: Dims, options: Any = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.scale = math.sqrt(2.0) * dims.init_std  # see the module docstring

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        return x + cast(self.scaled_rows(pos), x.dtype)  # (B,T,D)

    def scaled_rows(self, pos: Tensor) -> Tensor:
        """scale * the sinusoid of positions (B,T) -> (b,T,D) float32, b = 1 when every batch row holds the same
        positions (one table, broadcast; known with the extremes in one read), gathered from a table of positions 0..N-1
        kept across forwards (grown by doubling, at most TABLE_ELEMENTS floats): a decode step computed the float64
        sinusoid of its one position, about 15 small operators. Positions past the table are computed directly."""
        d = self.dims.d_model
        if torch.compiler.is_compiling():  # traced: the formula, which the compiler fuses (no extremes to read)
            return self.scale * sinusoidal_table(expanded_row(pos), d)
        pos, lowest, highest = shared_row_extremes(pos)  # (b,T)
        if lowest < 0 or (highest + 1) * d > TABLE_ELEMENTS:
            return self.scale * sinusoidal_table(pos, d)
        size = min(max(TABLE_MIN, 1 << highest.bit_length()), TABLE_ELEMENTS // d)  # > highest

        def build() -> Tensor:
            return self.scale * sinusoidal_table(torch.arange(size, device=pos.device), d)  # (N,D)

        table = kept(self, ("rows", pos.device), lambda t: t.shape[0] > highest, build)
        if pos.numel() == 1:
            return table.narrow(0, highest, 1).view(1, 1, d)
        return table.index_select(0, pos.reshape(-1)).view(*pos.shape, d)
