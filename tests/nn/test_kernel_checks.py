"""No input a user can build reaches memory a native kernel does not own: every entry (attend_rows,
attend_piecewise, attend_contextual, rotate_native) refuses shapes that disagree, in one line naming both, before
the call; the same inputs made to agree run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.nn import fused_attention, native
from posenc.rotary import _fast

pytestmark = pytest.mark.skipif(not native.has_gemm(), reason="native kernels unavailable here")


def _run_isolated(code: str) -> subprocess.CompletedProcess:
    """A case that used to abort the process (free(): invalid size) runs in a child: pytest survives it."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_rope_built_for_head_dim_16_on_head_dim_8_tensors_is_refused_not_aborted():
    result = _run_isolated(
        "import torch, posenc\n"
        "s = posenc.build('rope', posenc.Dims(d_model=128, n_head=8, head_dim=16, max_seq_len=256))\n"
        "q = torch.randn(1, 4, 16, 8)\n"
        "posenc.attention(q, q, q, s)\n")
    assert result.returncode == 1, result.stderr[-2000:]  # 134 (SIGABRT) before the check
    last = result.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last and "(1, 4, 16, 8)" in last


@pytest.mark.parametrize("heads", [4, 16])
@pytest.mark.parametrize("name", ["alibi", "kerple"])
def test_a_bias_for_8_heads_on_other_head_counts_is_refused(name, heads):
    scheme = posenc.build(name, posenc.Dims(d_model=128, n_head=8, head_dim=16, max_seq_len=256))
    q = torch.randn(1, heads, 64, 16)
    with pytest.raises(ValueError) as refused:
        posenc.attention(q, q, q, scheme)
    assert "H=8" in str(refused.value) and f"(1, {heads}, 64, 16)" in str(refused.value)


def test_expanded_operands_equal_their_contiguous_copies():
    """A stride-0 sequence axis (x.expand) is no BLAS leading dimension: the entry copies it."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 16, generator=g).expand(1, 2, 40, 16), torch.randn(1, 2, 40, 16, generator=g)
    rows, e = torch.randn(1, 2, 1, 79, generator=g), torch.tensor([39])
    for args in ((q, k, k), (k, q, q)):
        out = fused_attention.attend_rows(*args, rows, e, True)[0]
        ref = fused_attention.attend_rows(*(t.contiguous() for t in args), rows, e, True)[0]
        torch.testing.assert_close(out, ref)


# ---- the property: for every kernel, any one mismatch is a ValueError; the matched inputs run ----

def _operands(b, h, hkv, tq, tk, d):
    return torch.randn(b, h, tq, d), torch.randn(b, hkv, tk, d), torch.randn(b, hkv, tk, d)


def _rows_case(sizes, fault):
    b, h, hkv, tq, tk, d, s = sizes
    q, k, v = _operands(b, h, hkv, tq, tk, d)
    rows = torch.randn(1, h, 1, s)
    e = torch.full((b,), s // 2, dtype=torch.int64)
    if fault == "rows heads":
        rows = torch.randn(1, h + 1, 1, s)
    elif fault == "rows batch":
        rows = torch.randn(b + 1, h, 1, s)
    elif fault == "rows queries":
        rows = torch.randn(1, h, tq + 1, s)
    elif fault == "rows empty":
        rows = torch.randn(1, h, 1, 0)
    elif fault == "offsets":
        e = torch.zeros(b + 1, dtype=torch.int64)
    return lambda: fused_attention.attend_rows(*_apply_operand_fault(q, k, v, fault), rows, e, True, want_mass=True)


def _piecewise_case(sizes, fault):
    b, h, hkv, tq, tk, d, n_knots = sizes
    q, k, v = _operands(b, h, hkv, tq, tk, d)
    length = tk  # with e = Tq - 1, causal attention reads indices e - i + j = 0..Tk - 1: all of them, no more
    feature = torch.linspace(1.0, 0.0, length)
    divisor = torch.ones(1, tq)
    knots = torch.linspace(0.1, 0.9, n_knots)
    slope, intercept = torch.randn(h, n_knots + 1), torch.randn(h, n_knots + 1)
    e = torch.full((b,), tq - 1, dtype=torch.int64)
    if fault == "slope heads":
        slope, intercept = torch.randn(h + 1, n_knots + 1), torch.randn(h + 1, n_knots + 1)
    elif fault == "knots":
        knots = torch.linspace(0.1, 0.9, n_knots + 1)
    elif fault == "divisor queries":
        divisor = torch.ones(1, tq + 1)
    elif fault == "divisor batch":
        divisor = torch.ones(b + 1, tq)
    elif fault == "feature short":
        feature = feature[: length - 1]
    elif fault == "offsets low":
        e = e - 1
    q, k, v = _apply_operand_fault(q, k, v, fault)
    return lambda: fused_attention.attend_piecewise(q, k, v, feature, divisor, knots, slope, intercept, e, True)


def _contextual_case(sizes, fault):
    b, h, hkv, tq, tk, d, p = sizes
    q, k, v = _operands(b, h, hkv, tq, tk, d)
    rows = torch.randn(b, h, tq, p)
    if fault == "rows heads":
        rows = torch.randn(b, h + 1, tq, p)
    elif fault == "rows queries":
        rows = torch.randn(b, h, tq + 1, p)
    elif fault == "rows batch":
        rows = torch.randn(b + 1, h, tq, p)
    elif fault == "rows empty":
        rows = torch.randn(b, h, tq, 0)
    return lambda: fused_attention.attend_contextual(*_apply_operand_fault(q, k, v, fault), rows)


def _rotary_case(sizes, fault):
    b, h, _, _, t, d, _ = sizes
    x = torch.randn(b, h, t, d)
    half = d // 2
    cos, sin = torch.randn(1, 1, t, half), torch.randn(1, 1, t, half)
    if fault == "table wider than head":
        cos, sin = torch.randn(1, 1, t, half + 1), torch.randn(1, 1, t, half + 1)
    elif fault == "sin differs":
        sin = torch.randn(1, 1, t, max(half - 1, 0))
    return lambda: _fast.rotate_native(x, cos, sin, interleaved=False)


def _apply_operand_fault(q, k, v, fault):
    b, hkv, tk, d = k.shape
    if fault == "k heads":  # H + 1 never divides H
        k, v = torch.randn(b, q.shape[1] + 1, tk, d), torch.randn(b, q.shape[1] + 1, tk, d)
    elif fault == "v keys":
        v = torch.randn(b, hkv, tk + 1, d)
    elif fault == "v head dim":
        v = torch.randn(b, hkv, tk, d + 2)
    elif fault == "k batch":
        k, v = torch.randn(b + 1, hkv, tk, d), torch.randn(b + 1, hkv, tk, d)
    elif fault == "k float64":
        k = k.double()
    elif fault == "causal queries past keys":
        q = torch.randn(b, q.shape[1], tk + 1, d)
    return q, k, v


OPERAND_FAULTS = ["k heads", "v keys", "v head dim", "k batch", "k float64", "causal queries past keys"]
CASES = {
    "rows": (_rows_case, [*OPERAND_FAULTS, "rows heads", "rows batch", "rows queries", "rows empty", "offsets"]),
    "piecewise": (_piecewise_case, [*OPERAND_FAULTS, "slope heads", "knots", "divisor queries", "divisor batch",
                                    "feature short", "offsets low"]),
    "contextual": (_contextual_case, [*OPERAND_FAULTS, "rows heads", "rows queries", "rows batch", "rows empty"]),
    "rotary": (_rotary_case, ["table wider than head", "sin differs"]),
}


@st.composite
def _sizes(draw):
    hkv = draw(st.integers(1, 3))
    h = hkv * draw(st.integers(1, 3))
    tq = draw(st.integers(1, 40))
    tk = tq + draw(st.integers(0, 40))
    d = 2 * draw(st.integers(1, 12))
    return draw(st.integers(1, 3)), h, hkv, tq, tk, d, draw(st.integers(1, 9))


@pytest.mark.parametrize("kernel", sorted(CASES))
@settings(max_examples=40, deadline=None)
@given(sizes=_sizes(), data=st.data())
def test_every_kernel_refuses_any_one_mismatch_and_runs_when_matched(kernel, sizes, data):
    build, faults = CASES[kernel]
    assert build(sizes, None)() is not None  # the matched inputs run
    fault = data.draw(st.sampled_from(faults))
    with pytest.raises(ValueError) as refused:
        build(sizes, fault)()
    assert "\n" not in str(refused.value)
