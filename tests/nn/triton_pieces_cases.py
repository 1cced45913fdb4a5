"""The Triton kernel for a piecewise bias (FIRE) equals the float64 reference path: attention with FIRE's own dense
bias (Scheme.bias, its MLP evaluated on every pair), outputs and the gradients of q, k, v and every learnable FIRE
parameter (its c, its threshold L, both MLP layers).

Not collected by `make test` directly: tests/nn/test_triton_scheme_kernels.py runs this file with the others in one
fresh process (TRITON_INTERPRET=1 without a GPU: tiny shapes, and tiles forced small so that a query block meets
interior tiles, diagonal tiles and a ragged end; compiled on a CUDA machine at the GPU's own tiles).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from posenc.bias import fire as fire_module
from posenc.bias.fire import FIRE
from posenc.contract.models import perturb_scheme_parameters
from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.registry import build
from tests.conftest import tiny_config
from tests.nn.triton_support import (
    at_kernel_precision,
    attention_reference,
    exact_float32,
    gqa_group_with_large_partials,
    kernel_device,
    key_gradients_within,
    twins,
    within_reach,
)

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device()

from posenc.nn.triton import attention, piecewise_attention  # noqa: E402  (after the interpreter's setting)

SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
if not INTERPRETED:
    torch.set_float32_matmul_precision("high")  # float32 runs as TF32 on a GPU (attention.serves_float32)
# The floors of triton_support.within_reach's bound: the fixed tolerances these tests had.
TOLERANCE = {torch.float32: 2e-5 if exact_float32() else 5e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}
# FIRE's own parameters in bf16: their gradients add dS over whole segments of pairs, where each query's dS sums
# to 0 only up to bf16's rounding of P before P V (measured on causal_gqa_bf16: 4.5e-2 on the MLP's output layer,
# where the materialised bias in bf16 autograd errs by 2.0e-2 and q, k, v stay within 3e-2).
PARAMETER_TOLERANCE_BF16 = 6e-2
# Tiles forced down under the interpreter: BM != BN both ways, BM <= BN where the diagonal sums need it (not the
# parameter's sums per tile: BM > BN there, as the GPU's 128 x 32).
SMALL = {"pieces_forward": attention.Tiles(32, 16, 4, 2), "pieces_dkdv": attention.Tiles(16, 32, 4, 2),
         "pieces_dq": attention.Tiles(16, 16, 4, 2), "pieces_dq_grad": attention.Tiles(16, 32, 4, 2),
         "pieces_dq_param": attention.Tiles(32, 16, 4, 2)}

CASES = {  # name: (B, H, Hkv, Dh, Tq, Tk, causal, dtype, knot spread: see fire())
    "causal_gqa": (1, 2, 1, 16, 48, 48, True, torch.float32, 1.5),
    "after_cache": (2, 2, 1, 32, 13, 40, True, torch.float32, 1.0),
    "encoder": (1, 2, 2, 16, 33, 33, False, torch.float32, 1.5),
    "causal_gqa_bf16": (1, 2, 1, 16, 48, 48, True, torch.bfloat16, 1.0),
}


def close(actual, exact, low, dtype: torch.dtype, what: str, tolerance=None) -> None:
    """FlashAttention's rule against the float64 reference (exact) and the same at the kernel's precision (low)."""
    within_reach(actual, exact, low, tolerance or TOLERANCE[dtype], what)


def fire(heads: int, head_dim: int, threshold: float, spread: float = 1.0):
    """FIRE with perturbed weights and a threshold L inside the sequence (queries on both sides of max(L, i));
    spread > 1 moves its knots -b1 / w1 apart, so that tiles this small cross at most one (the kernels' fast loop)."""
    cfg = tiny_config("fire", n_head=heads, d_model=heads * head_dim, fire_init_threshold=threshold)
    torch.manual_seed(0)
    scheme = build("fire", dataclasses.replace(cfg.dims(), n_kv_head=heads // 2), cfg.options)
    holder = torch.nn.Module()
    holder.positions = torch.nn.ModuleList([scheme])
    perturb_scheme_parameters(holder)
    with torch.no_grad():
        scheme.mlp[0].bias.mul_(spread)
    return scheme.to(DEVICE)


def launched_dq(monkeypatch) -> list[str]:
    """The names of the launches that follow, dQ's named by how it sums the feature's gradient."""
    names = []
    launch = attention.launch

    def record(kernel, grid, *args, **options):
        name = kernel.fn.__name__
        names.append(f"{name} by parameter" if options.get("BY_PARAMETER") else name)
        return launch(kernel, grid, *args, **options)

    monkeypatch.setattr(attention, "launch", record)
    return names


def fire_for(case: str, cls: type[FIRE] = FIRE):
    """fire() for a case, its threshold L half way along the queries (queries on both sides of max(L, i))."""
    _, h, _, dh, tq, tk, _, _, spread = CASES[case]
    scheme = fire(h, dh, threshold=(tk - tq / 2) * SCALE, spread=spread)
    scheme.__class__ = cls
    return scheme


def check_fire(case: str, scheme, monkeypatch) -> None:
    """FIRE (scheme) through the dispatch's Triton kernel against its dense bias in float64: the output and the
    gradients of q, k, v and of every FIRE parameter."""
    b, h, hkv, dh, tq, tk, causal, dtype, _ = CASES[case]
    tq, tk = tq * SCALE, tk * SCALE
    if INTERPRETED:
        monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype_: SMALL[kernel])
    calls = []
    kernel = piecewise_attention.attend_kernel_pieces
    monkeypatch.setattr(piecewise_attention, "attend_kernel_pieces", lambda *a: calls.append(1) or kernel(*a))
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, tq, dh, generator=g)
    k, v = (torch.randn(b, hkv, tk, dh, generator=g) for _ in range(2))
    q, k, v = (t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v))
    k_pos = (torch.arange(tk) + 7).expand(b, tk).to(DEVICE)  # a cache offset: queries are the last tq keys
    q_pos, k_pos = scheme.frame(k_pos[:, tk - tq:], k_pos)
    out = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, causal)
    assert calls, "the dispatch must run FIRE through the Triton kernel"
    exact_scheme = copy.deepcopy(scheme).double()
    q64, k64, v64 = twins([q, k, v])
    exact = attention_reference(q64, k64, v64, exact_scheme.bias(q_pos, k_pos, q64, k64), causal)
    bias = scheme.bias(q_pos, k_pos, q, k)  # FIRE's MLP in float32: the kernel evaluates its pieces without tl.dot
    held = bias.detach().requires_grad_()
    with at_kernel_precision():  # the attention's products as the kernel's tl.dot makes them
        low = attention_reference(q, k, v, held, causal)  # the bias cast to q's dtype
    close(out, exact, low, dtype, f"{case} output")
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE)
    names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters())]
    fast = torch.autograd.grad(out, [q, k, v, *scheme.parameters()], grad.to(dtype))
    slow = torch.autograd.grad(exact, [q64, k64, v64, *exact_scheme.parameters()], grad)
    with at_kernel_precision():
        *rough, d_bias = torch.autograd.grad(low, [q, k, v, held], grad.to(dtype))
    rough += torch.autograd.grad(bias, list(scheme.parameters()), d_bias)
    assert slow[4].abs().max() > 0 and slow[3].abs().max() > 0, "L and c must both receive a gradient here"
    for n, (what, a, b_, c) in enumerate(zip(names, fast, slow, rough, strict=True)):
        parameter = n >= 3 and dtype == torch.bfloat16
        close(a, b_, c, dtype, f"{case} {what}", PARAMETER_TOLERANCE_BF16 if parameter else None)


@pytest.mark.parametrize("case", CASES)
def test_fire_kernel_equals_the_float64_dense_bias_with_every_gradient(case, monkeypatch):
    """Training FIRE, dQ sums its c's gradient per tile (the derivative of psi = log(1 + c d)), no diagonal sums."""
    launched = launched_dq(monkeypatch)
    check_fire(case, fire_for(case), monkeypatch)
    assert "_dq by parameter" in launched and "_row_reduce" not in launched, launched


class _WithoutDerivative(FIRE):
    """FIRE as a user's own piecewise scheme would give it: the feature without its parameter's derivative."""

    def piecewise_bias(self, q_pos, low, high):
        return dataclasses.replace(super().piecewise_bias(q_pos, low, high), feature_param=None,
                                   feature_derivative=None)


def test_pieces_without_the_feature_derivative_keep_the_diagonal_sums(monkeypatch):
    """A PiecewiseBias without feature_param (a user's own piecewise scheme): triton_pieces_param declines, the
    feature's gradient is summed by distance (diagonal sums, then the row reduction), and every gradient still equals
    the float64 reference."""
    launched = launched_dq(monkeypatch)
    check_fire("causal_gqa", fire_for("causal_gqa", _WithoutDerivative), monkeypatch)
    assert "_dq" in launched and "_row_reduce" in launched and "_dq by parameter" not in launched, launched


def test_a_wrong_feature_derivative_is_caught(monkeypatch):
    """The kernel reads c's gradient from the derivative FIRE gives: d psi / d c without its 1 / (1 + c d) factor
    must fail the float64 comparison on c (the comparison has teeth; the kernel reads the table)."""
    monkeypatch.setattr(fire_module, "_feature_derivative", lambda c, distance: distance)
    with pytest.raises(AssertionError, match="dlog_c"):
        check_fire("after_cache", fire_for("after_cache"), monkeypatch)


def dense_pieces(feature, divisor, knots, slopes, intercepts, e, tq, tk):
    """The piecewise bias (B,H,Tq,Tk) written out pair by pair (Scheme.piecewise_bias's definition)."""
    r = e[:, None, None] - torch.arange(tq, device=e.device)[:, None] + torch.arange(tk, device=e.device)
    x = feature[r.clamp(0, feature.shape[0] - 1)] / divisor[:, :, None]  # (B,Tq,Tk); clamped: masked pairs
    segment = torch.searchsorted(knots, x.detach().contiguous())  # knots below x
    return (slopes[:, segment] * x + intercepts[:, segment]).transpose(0, 1)


def _between(xs: torch.Tensor, target: float, reach: float) -> float:
    """A knot near target in the widest gap between neighbouring values of xs (sorted) within reach of it: no pair's
    x lies near it, so float32 and float64 put every pair on one side."""
    mids, gaps = (xs[1:] + xs[:-1]) / 2, xs[1:] - xs[:-1]
    near = (mids - target).abs() < reach
    return mids[near][gaps[near].argmax()].item() if near.any() else target


def _knots_for_tiles(x: torch.Tensor, valid: torch.Tensor, t: attention.Tiles) -> torch.Tensor:
    """Three knots for x (B,Tq,Tk) under tiles of t.bm queries x t.bn keys, each in an interval between the tiles' x
    ranges' ends: two in neighbouring intervals that one tile spans (crossed together: the knot loops), one below
    them that a tile crosses alone (the fast loops' branch), with a tile that crosses none; of all such choices the
    one whose narrowest interval is widest (the kernel's tile bounds are a little wider than x's own ranges)."""
    b, tq, tk = x.shape
    nq, nk = -(-tq // t.bm), -(-tk // t.bn)
    padded = torch.full((b, nq * t.bm, nk * t.bn), float("nan"), dtype=x.dtype)
    padded[:, :tq, :tk] = torch.where(valid, x, float("nan"))
    tiles = padded.view(b, nq, t.bm, nk, t.bn).permute(0, 1, 3, 2, 4).flatten(3)  # (B,NQ,NK,BM*BN)
    seen = ~tiles.isnan().all(-1)
    lo, hi = tiles.nan_to_num(float("inf")).amin(-1)[seen], tiles.nan_to_num(float("-inf")).amax(-1)[seen]
    ends = torch.cat([lo, hi]).unique()  # sorted
    mids, widths = (ends[1:] + ends[:-1]) / 2, ends[1:] - ends[:-1]
    spans = ((lo < mids[:, None]) & (mids[:, None] < hi)).double()  # (intervals, tiles)
    clear = (1 - spans[:-1]) * (1 - spans[1:])  # tiles crossing neither of two neighbouring intervals
    together = (spans[:-1] * spans[1:]).sum(1) > 0  # (pairs,)
    alone, none = spans @ clear.T > 0, (1 - spans) @ clear.T > 0  # (intervals, pairs)
    below = torch.arange(len(mids))[:, None] < torch.arange(len(mids) - 1)
    score = torch.minimum(torch.minimum(widths[:, None], widths[None, :-1]), widths[None, 1:])
    score = score.masked_fill(~(alone & none & below & together), -1)
    assert score.max() > 0, f"no knots fit the tiles of {t.bm} x {t.bn}"
    one, pair = divmod(score.argmax().item(), len(mids) - 1)
    xs = x[valid].unique()
    return torch.tensor([_between(xs, mids[n].item(), widths[n].item() / 2) for n in (one, pair, pair + 1)],
                        dtype=torch.float64)


def test_pieces_kernel_loops_equal_the_dense_formula_with_every_gradient(monkeypatch):
    """Pieces built so that tiles cross no knot, one knot (the fast loops' branch) and two (the knot loops), at the
    forward's own tiles (the GPU's, or 16 x 16 under the interpreter), with two batch rows at different offsets: the
    kernel equals the dense formula in float64, gradients of the feature, the divisor, the slopes and the
    intercepts included; and the gradient of a parameter of the feature, summed per tile from its derivative."""
    if INTERPRETED:  # 16 x 16 everywhere: a query block meets interior, diagonal and ragged tiles
        monkeypatch.setattr(attention, "tiles", lambda *a: attention.Tiles(16, 16, 4, 2))
    tables = []
    table = piecewise_attention._segment_table
    monkeypatch.setattr(piecewise_attention, "_segment_table", lambda *a, **kw: tables.append(table(*a, **kw))
                        or tables[-1])
    b, h, tq, tk = 2, 2, 48 * SCALE, 48 * SCALE
    g = torch.Generator().manual_seed(4)
    size = tq + tk + 4
    feature = 1.0 - torch.arange(size, dtype=torch.float64) / size  # x falls slowly: few knots per tile
    divisor = 1.0 + 0.01 * torch.arange(tq, dtype=torch.float64).expand(b, tq)
    e = torch.tensor([tq - 1, tq + 1])
    r = e[:, None, None] - torch.arange(tq)[:, None] + torch.arange(tk)  # (B,Tq,Tk)
    x = feature[r.clamp(0, size - 1)] / divisor[:, :, None]
    valid = (torch.arange(tk) <= torch.arange(tq)[:, None] + (tk - tq)).expand(b, tq, tk)
    knots = _knots_for_tiles(x, valid, attention.tiles("pieces_forward", 16, torch.device(DEVICE), torch.float32))
    slopes = 3 * torch.randn(h, 4, generator=g, dtype=torch.float64)
    intercepts = torch.zeros(h, 4, dtype=torch.float64)
    for s in range(3):  # continuous at the knots, as a ReLU MLP is: rounding at a knot moves nothing
        intercepts[:, s + 1] = intercepts[:, s] + (slopes[:, s] - slopes[:, s + 1]) * knots[s]
    q, k, v = (torch.randn(b, h, tq, 16, generator=g, dtype=torch.float64) for _ in range(3))
    leaves = [t.to(DEVICE).requires_grad_() for t in (q, k, v, feature, divisor, slopes, intercepts)]
    fast_in = [t.float().detach().requires_grad_() for t in leaves]
    out = piecewise_attention.attend_pieces(*fast_in[:4], fast_in[4], knots.float().to(DEVICE), *fast_in[5:],
                                            e.to(DEVICE), True)
    def reference(ins):
        bias = dense_pieces(ins[3], ins[4], knots.to(DEVICE, ins[0].dtype), *ins[5:], e.to(DEVICE), tq, tk)
        return attention_reference(*ins[:3], bias, True)

    exact = reference(leaves)
    with at_kernel_precision():  # no product in the dense pieces: only the attention's
        low = reference(fast_in)
    close(out, exact, low, torch.float32, "output")
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE)
    names = ("dq", "dk", "dv", "dfeature", "ddivisor", "dslopes", "dintercepts")
    with at_kernel_precision():
        rough = torch.autograd.grad(low, fast_in, grad.float())
    slow = torch.autograd.grad(exact, leaves, grad)
    for what, a, b_, c in zip(names, torch.autograd.grad(out, fast_in, grad.float()), slow, rough, strict=True):
        close(a, b_, c, torch.float32, what)
    # The feature as a function of one parameter, 1 - theta r / size at theta = 1, with its derivative: the kernel's
    # sum per tile (pieces_dq_param) is the feature's gradient projected on d feature / d theta = -r / size.
    theta = torch.ones((), device=DEVICE, requires_grad=True)
    ramp = (torch.arange(size, dtype=torch.float64) / size).to(DEVICE)
    out = piecewise_attention.attend_pieces(*fast_in[:3], 1.0 - theta * ramp.float(), fast_in[4],
                                            knots.float().to(DEVICE), *fast_in[5:], e.to(DEVICE), True, theta,
                                            -ramp.float())
    (d_theta,) = torch.autograd.grad(out, [theta], grad.float())
    close(d_theta, -(slow[3] * ramp).sum(), -(rough[3].double() * ramp).sum(), torch.float32, "dtheta")
    crossed = torch.cat([(segs[..., 1] - segs[..., 0]).flatten() for segs, _ in tables])
    assert {0, 1} <= set(crossed.tolist()) and crossed.max() > 1, f"tiles crossing {sorted(set(crossed.tolist()))}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_gqa_groups_key_gradients_are_added_in_float32(dtype):
    """triton_support.gqa_group_with_large_partials through the piecewise kernel, with the same slopes and
    intercepts for every head (the bias reads no q): dK and dV are within the 16-bit tolerance of the float64
    reference only where the kernel adds the group's partials in float32 (piecewise_attention.py's backward).
    Measured under the interpreter, error / bound: bf16 dK 0.0044 / 0.033, dV 0.0125 / 0.087; fp16 dK 0.00039 /
    0.0055, dV 0.00073 / 0.0145; with partials in 16 bits dK errs by 0.5 and 0.094, dV by 0.5 and 0.0625."""
    g = torch.Generator().manual_seed(0)
    t = 16
    q, k, v, dout = gqa_group_with_large_partials(t, 16, dtype, DEVICE, g)
    feature = 1.0 - torch.arange(2 * t - 1, dtype=torch.float64) / (2 * t)  # r = 0..2T-2 from e = T - 1
    divisor, knots = torch.ones(1, t, dtype=torch.float64), torch.tensor([0.3, 0.7], dtype=torch.float64)
    slopes = 3 * torch.randn(1, 3, generator=g, dtype=torch.float64).expand(4, -1)  # (H,K+1): alike
    intercepts = torch.zeros(4, 3, dtype=torch.float64)
    for s in range(2):  # continuous at the knots: float32 and float64 on either side of one differ by rounding
        intercepts[:, s + 1] = intercepts[:, s] + (slopes[:, s] - slopes[:, s + 1]) * knots[s]
    pieces = [x.to(DEVICE) for x in (feature, divisor, knots, slopes, intercepts)]
    e = torch.tensor([t - 1], device=DEVICE)
    out = piecewise_attention.attend_pieces(q, k, v, *(x.float() for x in pieces), e, True)
    fast = torch.autograd.grad(out, (k, v), dout)
    leaves = twins([q, k, v])
    exact = attention_reference(*leaves, dense_pieces(*pieces, e, t, t), True)
    key_gradients_within(fast, torch.autograd.grad(exact, leaves[1:], dout.double()), TOLERANCE[dtype],
                         f"pieces {dtype}")


def test_fire_kernel_without_parameter_gradients_and_its_bias_matters(monkeypatch):
    """Frozen FIRE (no parameter needs a gradient): dQ takes the plain variant; the output moves when the MLP does."""
    if INTERPRETED:
        monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype_: SMALL[kernel])
    scheme = fire(2, 16, threshold=8.0).requires_grad_(False)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 32 * SCALE, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    pos = torch.arange(32 * SCALE, device=DEVICE)[None]
    out = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    exact_inputs = twins([q, k, v])
    exact = attention_reference(*exact_inputs, copy.deepcopy(scheme).double().bias(pos, pos), True)
    bias = scheme.bias(pos, pos)  # frozen FIRE in float32, outside: the kernel evaluates its pieces without tl.dot
    with at_kernel_precision():
        low = attention_reference(q, k, v, bias, True)
        rough = torch.autograd.grad(low.square().sum(), [q, k, v])
    close(out, exact, low, torch.float32, "output")
    for what, a, b_, c in zip(("dq", "dk", "dv"), torch.autograd.grad(out.square().sum(), [q, k, v]),
                              torch.autograd.grad(exact.square().sum(), exact_inputs), rough, strict=True):
        close(a, b_, c, torch.float32, what)
    with torch.no_grad():
        scheme.mlp[2].weight.mul_(3.0)
        assert (dispatch.fast_attention(q, k, v, scheme, pos, pos, True) - out).abs().max() > 1e-2


def test_bad_pieces_are_refused_in_one_line():
    q = torch.zeros(1, 2, 5, 16, device=DEVICE)
    e = torch.tensor([4], device=DEVICE)
    feature, knots = torch.zeros(9, device=DEVICE), torch.zeros(3, device=DEVICE)
    lines = torch.zeros(2, 4, device=DEVICE)
    with pytest.raises(ValueError, match="divisor"):
        piecewise_attention.attend_pieces(q, q, q, feature, torch.ones(1, 4, device=DEVICE), knots, lines, lines, e,
                                          True)
    with pytest.raises(ValueError, match="slopes"):
        piecewise_attention.attend_pieces(q, q, q, feature, torch.ones(1, 5, device=DEVICE), knots,
                                          torch.zeros(3, 4, device=DEVICE), lines, e, True)

