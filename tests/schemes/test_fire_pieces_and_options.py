"""FIRE's MLP as exact linear pieces (relu_mlp_pieces) against the MLP evaluated directly, including
degenerate MLPs (zero first-layer weights, a single hidden unit, knots on either side of 0, all weights
zero); FIRE's inputs and pieces with a tiny c, where the paper's eps in psi(max(L, i)) + eps shows;
options validation naming the field and value; initial c and L equal to the options; float64 modules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from posenc.bias._piecewise import relu_mlp_pieces
from posenc.bias.fire import FIRE, FIRE_EPS, FIREOptions, fire_inputs
from posenc.scheme import Dims

DIMS = Dims(32, 3, 8, 64)


def mlp(w1: list[float], b1: list[float], heads: int = 3, seed: int = 0) -> tuple[nn.Linear, nn.Linear]:
    """Linear(1, W) with the given weights and biases, Linear(W, heads) random with a nonzero bias."""
    torch.manual_seed(seed)
    first, second = nn.Linear(1, len(w1)), nn.Linear(len(w1), heads)
    with torch.no_grad():
        first.weight.copy_(torch.tensor(w1)[:, None])
        first.bias.copy_(torch.tensor(b1))
        second.bias.add_(1.0)
    return first, second


def evaluate_pieces(knots, slopes, intercepts, x: torch.Tensor) -> torch.Tensor:
    """(H,) per x: segment s = number of knots strictly below x (knots[s-1] < x <= knots[s])."""
    s = (knots[None, :] < x[:, None]).sum(1)  # (N,)
    return slopes[:, s] * x + intercepts[:, s]  # (H,N)


MLPS = {
    "random": ([0.7, -1.3, 2.0, 0.4, -0.2], [0.1, 0.5, -1.0, -0.3, 0.9]),
    "one unit, knot at 0.5": ([2.0], [-1.0]),  # inside (0, 1): any end 'beyond' must still lie outside
    "one unit, knot at 2": ([1.0], [-2.0]),  # w1 exactly 1 must count as a turning unit
    "one unit, knot at -2, off to the right": ([-0.5], [-1.0]),
    "zero first-layer weights": ([0.0, 1.5, 0.0, -1.0], [0.3, -0.6, -0.2, 0.25]),
    "two units, one knot": ([1.0, 2.0], [-1.0, -2.0]),
    "all first-layer weights zero": ([0.0, 0.0, 0.0], [0.5, -0.5, 0.0]),
    "no knots, unit always on": ([0.0], [1.0]),
}


@pytest.mark.parametrize("name", MLPS)
def test_pieces_equal_the_mlp_everywhere(name):
    first, second = mlp(*MLPS[name])
    knots, slopes, intercepts = relu_mlp_pieces(first, second)
    width, turning = len(MLPS[name][0]), sum(w != 0 for w in MLPS[name][0])
    assert knots.shape == (width,) and bool((knots[1:] >= knots[:-1]).all())  # one knot per unit, whatever w1
    assert int(knots.isfinite().sum()) == turning and bool((knots[turning:] == math.inf).all())  # never turns: +inf
    assert slopes.shape == intercepts.shape == (3, width + 1)
    knots = knots[:turning]
    x = torch.cat((torch.linspace(-6, 6, 1201), knots, knots - 1e-3, knots + 1e-3))
    with torch.no_grad():
        direct = second(torch.relu(first(x[:, None]))).T  # (H,N)
        torch.testing.assert_close(evaluate_pieces(knots, slopes, intercepts, x), direct, rtol=1e-5, atol=1e-5)


def test_all_zero_mlp_is_zero_on_every_piece():
    first, second = nn.Linear(1, 4), nn.Linear(4, 2)
    for p in (*first.parameters(), *second.parameters()):
        nn.init.zeros_(p)
    knots, slopes, intercepts = relu_mlp_pieces(first, second)
    assert bool((knots == math.inf).all()) and slopes.shape == intercepts.shape == (2, 5)  # no unit turns
    assert not slopes.any() and not intercepts.any()


def direct_inputs(i: float, j: float, c: float, big_l: float) -> float:
    """Li et al. 2023 with the appendix code's eps: log(c (i - j) + 1) / (log(c max(L, i) + 1) + eps)."""
    return math.log1p(c * max(i - j, 0.0)) / (math.log1p(c * max(big_l, i)) + FIRE_EPS)


def test_fire_inputs_with_a_tiny_c_keep_the_papers_eps():
    """c = 1e-4, L = 1: psi(max(L, i)) ~ 1e-4..1e-3, so +eps and -eps differ by ~1%."""
    c, big_l = torch.tensor(1e-4), torch.tensor(1.0)
    pos = torch.arange(10)[None]
    got = fire_inputs(pos, pos, c, big_l)[0]
    for i in range(10):
        for j in range(i + 1):
            assert got[i, j].item() == pytest.approx(direct_inputs(i, j, 1e-4, 1.0), rel=1e-4)


def piecewise_as_bias(pieces, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """PiecewiseBias read by its docstring: bias(b,h,i,j) = slopes[h,s] x + intercepts[h,s],
    x = feature[r - low] / divisor[b,i], r = n - m. Returns (B,H,Tq,Tk)."""
    r = k_pos[:, None, :] - q_pos[:, :, None]  # (B,Tq,Tk)
    x = pieces.feature[r - pieces.low] / pieces.divisor[:, :, None]
    s = (pieces.knots < x[..., None]).sum(-1)  # (B,Tq,Tk)
    return (pieces.slopes[:, s] * x + pieces.intercepts[:, s]).permute(1, 0, 2, 3)


def test_fire_piecewise_bias_equals_bias_with_a_tiny_c():
    torch.manual_seed(1)
    scheme = FIRE(DIMS, fire_init_c=1e-4, fire_init_threshold=1.0)
    pos = torch.arange(12)[None]
    pieces = scheme.piecewise_bias(pos, -11, 11)
    assert pieces.feature.shape == (23,)  # one entry per r in [low, high]
    with torch.no_grad():
        expected = scheme.bias(pos, pos)
        got = piecewise_as_bias(pieces, pos, pos)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., causal], expected[..., causal], rtol=1e-4, atol=1e-5)


def test_initial_c_and_threshold_equal_the_options():
    scheme = FIRE(DIMS, fire_init_c=1e-5, fire_init_threshold=2e-5)  # small: a floor-sized error shows
    assert scheme.c.item() == pytest.approx(1e-5, rel=1e-4)
    assert scheme.threshold.item() == pytest.approx(2e-5, rel=1e-4)


def test_fire_uses_its_options_object_and_dims():
    scheme = FIRE(DIMS, FIREOptions(fire_mlp_width=3))
    assert scheme.mlp[0].out_features == 3 and scheme.mlp[2].out_features == DIMS.n_head
    assert scheme.dims == DIMS
    assert "heads=3, mlp_width=3" in repr(scheme)


def test_fire_in_float64_runs_in_float64():
    scheme = FIRE(DIMS).double()
    pos = torch.arange(5)[None]
    assert scheme.bias(pos, pos).dtype == torch.float64


@pytest.mark.parametrize(("field", "value"), [("fire_init_c", 0.0), ("fire_init_c", -1.0), ("fire_init_c", math.inf),
                                              ("fire_init_threshold", 0.0), ("fire_init_threshold", -3.0),
                                              ("fire_init_threshold", math.inf), ("fire_mlp_width", 0)])
def test_options_reject_values_outside_the_open_ranges(field, value):
    with pytest.raises(ValueError, match=field) as caught:
        FIREOptions(**{field: value})
    assert str(value) in str(caught.value)


@pytest.mark.parametrize("threshold", [0.5, 1e-3])  # L below 1 is allowed: (0, inf)
def test_options_accept_a_threshold_below_one(threshold):
    assert FIREOptions(fire_init_threshold=threshold).fire_init_threshold == threshold
