"""`sinusoidal`: fixed sin/cos position vectors added to embeddings (Vaswani et al. 2017, sec. 3.5).

PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
Computed from the explicit positions in float64, so any position works and no table limits length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.scheme import Dims, Scheme


def sinusoidal_table(pos: Tensor, d: int, base: float = 10000.0) -> Tensor:
    """pos (...,) -> (..., d) float32: sin on even dims, cos on odd dims."""
    i = torch.arange(0, d, 2, dtype=torch.float64, device=pos.device)
    angle = pos.to(torch.float64)[..., None] / base ** (i / d)  # (..., ceil(d/2))
    out = torch.empty(*pos.shape, d, dtype=torch.float64, device=pos.device)
    out[..., 0::2] = angle.sin()
    out[..., 1::2] = angle.cos()[..., : d // 2]
    return out.to(torch.float32)


class Sinusoidal(Scheme):
    relative = False

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        return x + sinusoidal_table(pos, self.dims.d_model).to(x.dtype)  # (B,T,D)
