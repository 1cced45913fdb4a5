"""A ReLU MLP of one input, f(x) = W2 relu(W1 x + b1) + b2, is piecewise linear in x: each hidden unit turns
on or off at its knot -b1/w1, and between knots f is a line per output. Its pieces, for fast paths that
evaluate the bias per block (posenc.scheme.PiecewiseBias)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


@torch.no_grad()
def relu_mlp_segments(first: nn.Linear) -> tuple[Tensor, Tensor]:
    """first: Linear(1, W) -> knots (W,) ascending, and active (W+1, W): 1 where a unit is on in segment s
    (knots[s-1] < x <= knots[s]). A unit with w1 = 0 never turns: its knot is +inf, past every x (K = W always, so
    nothing here reads a value back to the host, as selecting the turning units would: a size that depends on
    values waits for the device). Not differentiable (which units are on is not, as relu' is not)."""
    w1, b1 = first.weight[:, 0], first.bias  # (W,)
    knots = torch.where(w1 != 0, -b1 / w1, math.inf).sort().values  # (W,)
    lo = torch.cat((knots.new_full((1,), -math.inf), knots))  # (W+1,) each segment's ends
    hi = torch.cat((knots, knots.new_full((1,), math.inf)))
    # A point inside each segment: the middle, or beyond the last finite end by a margin that survives rounding;
    # 0 where neither end is finite (the whole line when no unit turns; else an empty segment).
    points = torch.where(lo.isfinite(), torch.where(hi.isfinite(), (lo + hi) / 2, lo + lo.abs() + 1),
                         torch.where(hi.isfinite(), hi - hi.abs() - 1, 0.0))  # (W+1,)
    return knots, (points[:, None] * w1 + b1 > 0).to(w1.dtype)  # (W+1,W)


def relu_mlp_pieces(first: nn.Linear, second: nn.Linear,
                    segments: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """first: Linear(1, W), second: Linear(W, H) -> knots (W,) ascending, slopes and intercepts (H, W+1): on
    segment s (knots[s-1] < x <= knots[s]) f(x) = slopes[:, s] x + intercepts[:, s]. Differentiable in the
    weights. segments: relu_mlp_segments(first) when the caller kept it (it changes only with first's weights)."""
    knots, active = relu_mlp_segments(first) if segments is None else segments
    w1, b1 = first.weight[:, 0], first.bias  # (W,)
    slopes = (active * w1) @ second.weight.T  # (W+1,H)
    intercepts = (active * b1) @ second.weight.T + second.bias
    return knots, slopes.T, intercepts.T


__all__ = ["relu_mlp_pieces", "relu_mlp_segments"]
