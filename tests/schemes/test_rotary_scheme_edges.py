"""Rotary scheme edges the main tests miss: xPos tables against the float64 formula of Sun et al. 2022 and
a token's own score unscaled even past the exact span (both clamps); N-d RoPE angles against the
RoPE-Axial formula written out, its validation messages naming field and value; p-RoPE with p = 1 equal
to RoPE under a length-dependent (dynamic) scaling; buffers kept out of checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.rotary.nd import NdRoPE, NdRoPEOptions, axis_pairs, nd_angles, nd_inv_frequencies
from posenc.rotary.p_rope import PRoPE
from posenc.rotary.rope import RoPE
from posenc.rotary.xpos import XPOS_MAX_LOG, XPos, xpos_exact_span, xpos_log_zeta, xpos_tables
from posenc.scheme import Dims

DIMS = Dims(d_model=64, n_head=2, head_dim=32, max_seq_len=128)


def xpos_scale(pos: np.ndarray, rot_dim: int, scale_base: float, sign: float) -> np.ndarray:
    """Sun et al. 2022 eq. 9-10 in float64: zeta_i^(sign p / scale_base), zeta_i = (2i + 0.4 R) / (1.4 R)."""
    two_i = np.arange(0, rot_dim, 2)
    zeta = (two_i + 0.4 * rot_dim) / (1.4 * rot_dim)
    return zeta[None, :] ** (sign * pos[:, None] / scale_base)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_xpos_tables_match_the_float64_formula(sign):
    scheme = XPos(DIMS, xpos_scale_base=1000.0)  # not a power of 2: pos / scale_base must round in float64
    pos = torch.tensor([[0, 1, 7, 999, 4321, 12345]])
    cos, sin = xpos_tables(pos, scheme.inv_freq, scheme.log_zeta, 1000.0, sign)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (1, 1, 6, 16)
    # inv_freq is float32 (as RoPE's): the angles use the same rounded frequencies, in float64.
    theta = (pos[0].double()[:, None] * scheme.inv_freq.double()).numpy()
    scale = xpos_scale(pos[0].numpy().astype(np.float64), 32, 1000.0, sign)
    np.testing.assert_allclose(cos[0, 0].double().numpy(), np.cos(theta) * scale, rtol=3e-7, atol=1e-30)
    np.testing.assert_allclose(sin[0, 0].double().numpy(), np.sin(theta) * scale, rtol=3e-7, atol=1e-30)


def test_xpos_own_score_is_unscaled_even_past_the_exact_span():
    """q and k at one position carry zeta^(p/s) and zeta^(-p/s): their product is 1 at any p, as long as
    both exponents are clamped to +-XPOS_MAX_LOG alike."""
    scale_base = 64.0
    far = int(3 * xpos_exact_span(32, scale_base))
    pos = torch.tensor([[0, 100, far]])
    log_zeta = xpos_log_zeta(32)
    inv_freq = RoPE(DIMS).inv_freq
    cq, sq = xpos_tables(pos, inv_freq, log_zeta, scale_base, 1.0)
    ck, sk = xpos_tables(pos, inv_freq, log_zeta, scale_base, -1.0)
    torch.testing.assert_close(cq * ck + sq * sk, torch.ones_like(cq), rtol=1e-5, atol=0)
    assert cq[0, 0, 2, 0].abs() <= np.exp(-XPOS_MAX_LOG) * (1 + 1e-6)  # pair 0 decays fastest: clamped


def test_xpos_memo_sees_positions_changed_in_place():
    torch.manual_seed(0)
    scheme = XPos(DIMS)
    q, k = torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32)
    pos = torch.arange(5)[None]
    scheme.rotate(q, k, pos, pos)
    pos.mul_(3)  # same tensor object, new version
    got = scheme.rotate(q, k, pos, pos)
    want = XPos(DIMS).rotate(q, k, torch.arange(5)[None] * 3, torch.arange(5)[None] * 3)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("scheme", [lambda: XPos(DIMS), lambda: NdRoPE(DIMS, n_axes=3)])
def test_rotary_tables_stay_out_of_the_state_dict(scheme):
    assert scheme().state_dict() == {}


def axial_formula(pos: np.ndarray, rot_dim: int, base: float, n_axes: int) -> np.ndarray:
    """Heo et al. 2024 eq. 8-9: axis a owns a block of R_a/2 pairs, angle p_a * base^(-2j/R_a)."""
    pairs, rest = divmod(rot_dim // 2, n_axes)
    blocks = []
    for a in range(n_axes):
        n = pairs + (a < rest)
        theta = (base ** (-2.0 * np.arange(n) / (2 * n))).astype(np.float32).astype(np.float64)
        blocks.append(pos[..., a, None] * theta)
    return np.concatenate(blocks, -1)


@pytest.mark.parametrize(("rot_dim", "n_axes"), [(32, 2), (32, 3), (12, 6), (8, 1)])
def test_nd_angles_match_the_axial_formula(rot_dim, n_axes):
    g = torch.Generator().manual_seed(n_axes)
    pos = torch.randint(0, 3000, (2, 5, n_axes), generator=g)
    got = nd_angles(pos, nd_inv_frequencies(rot_dim, 10000.0, n_axes))
    assert got.dtype == torch.float64 and got.shape == (2, 5, rot_dim // 2)
    np.testing.assert_allclose(got.numpy(), axial_formula(pos.numpy().astype(np.float64), rot_dim, 10000.0, n_axes),
                               rtol=1e-6)


def test_nd_rope_rotates_keys_by_their_own_positions():
    torch.manual_seed(0)
    scheme = NdRoPE(DIMS, NdRoPEOptions(n_axes=3))  # an options object, not keywords
    assert scheme.n_axes == 3 and scheme.dims == DIMS
    q, k = torch.randn(1, 2, 4, 32), torch.randn(1, 2, 6, 32)
    q_pos, k_pos = torch.randint(0, 50, (1, 4, 3)), torch.randint(0, 50, (1, 6, 3))
    cos, sin = scheme.tables(k_pos)
    assert cos.dtype == sin.dtype == torch.float32
    _, got = scheme.rotate(q, k, q_pos, k_pos)
    theta = torch.tensor(axial_formula(k_pos.numpy().astype(np.float64), 32, 10000.0, 3))[:, None]  # (1,1,6,16)
    x1, x2 = k.double()[..., :16], k.double()[..., 16:]  # half-split pairs (x_j, x_{j+R/2})
    want = torch.cat((x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin()), -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_axis_pairs_bounds_and_messages():
    assert axis_pairs(4, 4) == [1, 1, 1, 1]  # one pair per axis is enough
    for bad in (True, 0, 5, 2.0):
        with pytest.raises(ValueError) as caught:
            axis_pairs(4, bad)
        assert str(caught.value).startswith(f"n_axes={bad!r} ") and "[1, 4]" in str(caught.value)
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        nd_inv_frequencies(8, 10000.0, 5)


def test_nd_angles_rejects_positions_of_the_wrong_width():
    with pytest.raises(ValueError) as caught:
        nd_angles(torch.zeros(1, 3, 2, dtype=torch.int64), nd_inv_frequencies(8, 10000.0, 3))
    assert str(caught.value).startswith("positions.shape=(1, 3, 2) ") and "(batch, length, 3)" in str(caught.value)


@pytest.mark.parametrize(("field", "value"), [("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
                                              ("seq_len_interpolation_factor", 2.0)])
def test_nd_rope_rejects_each_scaling_naming_it(field, value):
    with pytest.raises(ValueError) as caught:
        NdRoPEOptions(**{field: value})
    assert str(caught.value).startswith(f"{field}={value!r} ") and "N-d RoPE" in str(caught.value)


def test_p_one_is_rope_under_a_dynamic_scaling():
    """Dynamic NTK frequencies depend on the current length; p-RoPE must pass that length on."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    pos = torch.arange(0, 400, 7)[None]  # past max_seq_len = 128: the base grows
    p_one, rope = PRoPE(DIMS, p_rope_fraction=1.0, rope_scaling=scaling), RoPE(DIMS, rope_scaling=scaling)
    for got, want in zip(p_one.tables(pos), rope.tables(pos), strict=True):
        torch.testing.assert_close(got, want)
    static = RoPE(DIMS).tables(pos)[0]
    assert not torch.allclose(rope.tables(pos)[0], static)  # the check has teeth
