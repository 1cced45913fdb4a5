"""An independent RoPE for tests: numpy float64 angles and rotation, sharing no code with posenc."""

from __future__ import annotations

import numpy as np
import torch


def numpy_rotate(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (B,H,T,Dh), pos (B,T), inv_freq (R/2,) -> x with its first R dims rotated, float64."""
    xs = x.double().numpy()
    freq = inv_freq.double().numpy()
    rot = 2 * freq.shape[0]
    theta = pos.numpy().astype(np.float64)[:, None, :, None] * freq  # (B,1,T,R/2), exact products in float64
    cos, sin = np.cos(theta), np.sin(theta)
    if interleaved:
        a, b = xs[..., 0:rot:2], xs[..., 1:rot:2]
    else:
        a, b = xs[..., : rot // 2], xs[..., rot // 2 : rot]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    out = xs.copy()
    if interleaved:
        out[..., 0:rot:2], out[..., 1:rot:2] = ra, rb
    else:
        out[..., : rot // 2], out[..., rot // 2 : rot] = ra, rb
    return torch.from_numpy(out)
