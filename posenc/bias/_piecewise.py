"""A ReLU MLP of one input, f(x) = W2 relu(W1 x + b1) + b2, is piecewise linear in x: each hidden unit turns
on or off at its knot -b1/w1, and between knots f is a line per output. Its pieces, for fast paths that
evaluate the bias per block (posenc.scheme.PiecewiseBias)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def relu_mlp_pieces(first: nn.Linear, second: nn.Linear) -> tuple[Tensor, Tensor, Tensor]:
    """first: Linear(1, W), second: Linear(W, H) -> knots (K,) ascending, slopes and intercepts (H, K+1): on
    segment s (knots[s-1] < x <= knots[s]) f(x) = slopes[:, s] x + intercepts[:, s]. Differentiable in the
    weights (which units are on in a segment is not, as relu' is not)."""
    w1, b1 = first.weight[:, 0], first.bias  # (W,)
    with torch.no_grad():
        turns = w1 != 0
        knots = (-b1[turns] / w1[turns]).sort().values  # (K,)
        if knots.numel():  # a point inside each segment; beyond the ends by a margin that survives rounding
            ends = torch.stack((knots[0] - knots[0].abs() - 1, knots[-1] + knots[-1].abs() + 1))
            points = torch.cat((ends[:1], (knots[1:] + knots[:-1]) / 2, ends[1:]))  # (K+1,)
        else:
            points = torch.zeros(1, dtype=w1.dtype, device=w1.device)
        active = (points[:, None] * w1 + b1 > 0).to(w1.dtype)  # (K+1,W): unit on in segment
    slopes = (active * w1) @ second.weight.T  # (K+1,H)
    intercepts = (active * b1) @ second.weight.T + second.bias
    return knots, slopes.T, intercepts.T


__all__ = ["relu_mlp_pieces"]
