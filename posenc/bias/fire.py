"""`fire`: functional interpolation for relative positions (Li et al. 2023, "Functional Interpolation
for Relative Positions Improves Long Context Transformers", arXiv 2310.04418, and its appendix code).

  b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1)
f_theta: R -> R^H is an MLP (1 -> 32 -> H, ReLU), one bias per head, shared by all layers.
c > 0 and the threshold L > 0 are learned. Dividing by psi(i) ("progressive interpolation") maps
every causal pair j <= i into [0, 1] whatever the length, so longer sequences reuse inputs f saw
in training; L keeps short contexts from being over-stretched; the log amplifies local distances.

The bias depends on the query's position i, not only on i - j. Here i is measured from the
sequence's first token (the `frame` hook subtracts each row's first key position, the cache's
first position when decoding), so position_ids 1000..1023 and 0..23 give the same logits. That
makes the logits invariant to a uniform shift of position ids, which is the property the
`shift_invariant` flag (and the contract suite) stands for; FIRE's paper title calls it relative too.
c and L are stored as logarithms (plus a tiny floor), so no gradient step can make them
non-positive (the paper's code takes absolute values instead); a step on log L moves L by a
fraction of itself, as a step on the paper's multiplier of L's initial value does.
Causal only: for j > i the input would leave [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.bias._distance import shared_rows
from posenc.bias._piecewise import relu_mlp_pieces, relu_mlp_segments
from posenc.nn.kept_tables import kept, wanted_gradient
from posenc.scheme import Dims, PiecewiseBias, Scheme, from_first_key
from posenc.validators import number_in, positive_int

FIRE_EPS = 1e-6  # the paper's code adds it to psi(max(L, i)) so a tiny c cannot divide by ~0
FIRE_FLOOR = 1e-6  # c, L >= this: exp of a very negative log underflows to exactly 0 in float32


def fire_inputs(q_pos: Tensor, k_pos: Tensor, c: Tensor, threshold: Tensor) -> Tensor:
    """(B,Tq), (B,Tk) positions -> psi(i - j) / psi(max(L, i)) as (B,Tq,Tk) float32."""
    i = q_pos.to(torch.float32)[:, :, None]  # (B,Tq,1)
    j = k_pos.to(torch.float32)[:, None, :]  # (B,1,Tk)
    # Future keys (j > i) are masked by attention; clamping keeps their log finite (no NaN gradient).
    distance = (i - j).clamp_min(0.0)  # (B,Tq,Tk)
    normalizer = torch.log1p(c * torch.maximum(i, threshold)) + FIRE_EPS  # (B,Tq,1)
    return torch.log1p(c * distance) / normalizer


def _distance(low: int, high: int, device: torch.device) -> Tensor:
    """m - n for r = n - m = low..high as (S,) float32, future keys (r > 0) clamped to 0 as in fire_inputs."""
    return (-torch.arange(low, high + 1, device=device)).clamp_min(0).to(torch.float32)


def _feature(c: Tensor, distance: Tensor) -> Tensor:
    """psi(m - n) = log(1 + c (m - n)) at _distance's m - n."""
    return torch.log1p(c * distance)


def _feature_derivative(c: Tensor, distance: Tensor) -> Tensor:
    """d psi(m - n) / d c = (m - n) / (1 + c (m - n)) at _distance's m - n (0 for future keys: psi is 0 there),
    without a gradient of its own."""
    with torch.no_grad():
        return distance / (c * distance + 1)


@dataclass(frozen=True, kw_only=True)
class FIREOptions:
    fire_mlp_width: int = 32  # hidden units of f_theta (Li et al. 2023 use 32)
    fire_init_c: float = 0.1  # initial c of psi(x) = log(c x + 1) (the paper's init)
    fire_init_threshold: float = 512.0  # initial L of psi(max(L, i)) (the paper's init)

    def __post_init__(self) -> None:
        positive_int("fire_mlp_width", self.fire_mlp_width)
        number_in("fire_init_c", self.fire_init_c, 0.0, math.inf, low_open=True, high_open=True)
        number_in("fire_init_threshold", self.fire_init_threshold, 0.0, math.inf, low_open=True, high_open=True)


class FIRE(Scheme):
    Options = FIREOptions
    shift_invariant = True  # see the module docstring: invariant to uniform shifts via frame()
    supports_bidirectional = False

    def __init__(self, dims: Dims, options: FIREOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        o = self.options
        self.mlp = nn.Sequential(nn.Linear(1, o.fire_mlp_width), nn.ReLU(), nn.Linear(o.fire_mlp_width, dims.n_head))
        self.log_c = nn.Parameter(torch.tensor(math.log(max(o.fire_init_c - FIRE_FLOOR, FIRE_FLOOR))))
        self.log_threshold = nn.Parameter(torch.tensor(math.log(max(o.fire_init_threshold - FIRE_FLOOR, FIRE_FLOOR))))

    def frame(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return from_first_key(q_pos, k_pos)  # i is measured from the sequence's first token

    @property
    def c(self) -> Tensor:
        return self.log_c.exp() + FIRE_FLOOR

    @property
    def threshold(self) -> Tensor:
        return self.log_threshold.exp() + FIRE_FLOOR

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        q_pos, k_pos = shared_rows(q_pos, k_pos)  # rows sharing positions share one evaluation of the MLP
        x = fire_inputs(q_pos, k_pos, self.c, self.threshold)  # (B|1,Tq,Tk)
        x = x.to(self.mlp[0].weight.dtype).unsqueeze(-1)  # (B|1,Tq,Tk,1)
        return self.mlp(x).permute(0, 3, 1, 2)  # (B|1,Tq,Tk,H) -> (B|1,H,Tq,Tk)

    def piecewise_bias(self, q_pos: Tensor, low: int, high: int) -> PiecewiseBias:
        """The bias as the MLP's exact pieces of x = psi(i - j) / psi(max(L, i)): feature psi(m - n) for
        r = n - m in [low, high] (future keys clamped to 0, as fire_inputs does), divisor per query: for every
        batch row unless the rows are one row expanded (asking whether rows are equal reads the device, which
        costs a GPU more than a divisor per row). psi's one parameter c and d psi / d c come with them
        (PiecewiseBias.feature_param: a GPU kernel sums c's gradient per tile, not psi's by distance), with or without
        a gradient: a training forward builds the pieces without one first (posenc.nn.recomputed) and again with one
        in its backward, and both must hold the same tensors."""
        i = (q_pos[:1] if q_pos.stride(0) == 0 else q_pos).to(torch.float32)  # (B|1,Tq)
        if wanted_gradient(self):
            c, threshold, (knots, slopes, intercepts) = self.c, self.threshold, self._pieces()
            distance = _distance(low, high, q_pos.device)
            feature, derivative = _feature(c, distance), _feature_derivative(c, distance)
        else:
            c, threshold, (knots, slopes, intercepts), feature, derivative = self._kept_terms(low, high, q_pos.device)
        divisor = torch.log1p(c * torch.maximum(i, threshold)) + FIRE_EPS
        return PiecewiseBias(feature, low, divisor, knots, slopes, intercepts, c, derivative)

    def _pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP's pieces; which units are on in each segment is kept while the first layer is unchanged (a
        training step asks twice: in the forward and in the backward's rebuild of the pieces, row_paths)."""
        first = self.mlp[0]
        segments = kept(first, "segments", lambda value: True, lambda: relu_mlp_segments(first))
        return relu_mlp_pieces(first, self.mlp[2], segments)

    def _kept_terms(self, low: int, high: int, device: torch.device) -> tuple:
        """c, L, the MLP's pieces, the feature and its derivative for r = low..high: functions of the parameters
        alone, kept while they are unchanged (a decode step asked for all of them at every token: about 30 small
        operators) over a span of r that doubles when outgrown."""
        def covers(value: tuple) -> bool:
            return value[0] <= low and high <= value[1]

        def build() -> tuple:
            first, last = min(low, 2 * low), max(high, 2 * high)
            c, distance = self.c, _distance(first, last, device)
            return (first, last, c, self.threshold, self._pieces(), _feature(c, distance),
                    _feature_derivative(c, distance))

        first, _, c, threshold, pieces, feature, derivative = kept(self, ("terms", device), covers, build)
        return c, threshold, pieces, feature[low - first : high - first + 1], derivative[low - first : high - first + 1]

    def extra_repr(self) -> str:
        return f"heads={self.dims.n_head}, mlp_width={self.mlp[0].out_features}"


__all__ = ["FIRE", "fire_inputs"]
