"""RoPE and xPos properties (Su et al. 2021; Sun et al. 2022), on the rotate hook directly."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.rotary._core import apply_rotary_reference, inv_frequencies
from posenc.rotary.rope import RoPE
from posenc.rotary.xpos import XPos, xpos_exact_span, xpos_log_zeta
from posenc.scheme import Dims
from tests.rotary_reference import numpy_rotate

DIMS = Dims(d_model=64, n_head=2, head_dim=32, max_seq_len=128)


def rotated_dot(scheme, q, k, m: int, n: int) -> torch.Tensor:
    """q at position m, k at position n, rotated by the scheme; returns q.k per head (H,)."""
    qr, _ = scheme.rotate(q, q, torch.tensor([[m]]), torch.tensor([[m]]))
    _, kr = scheme.rotate(k, k, torch.tensor([[n]]), torch.tensor([[n]]))
    return (qr.double() * kr.double()).sum(-1).flatten()


def unit_vectors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 1, 32, generator=g), torch.randn(1, 2, 1, 32, generator=g)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percentage", [1.0, 0.5, 0.25])
@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(0, 100_000))
def test_rope_score_depends_only_on_offset(interleaved, percentage, m, n, shift):
    rope = RoPE(DIMS, rotary_percentage=percentage, rotary_interleaved=interleaved)
    q, k = unit_vectors()
    torch.testing.assert_close(rotated_dot(rope, q, k, m, n), rotated_dot(rope, q, k, m + shift, n + shift),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_complex_reference_both_pairings(interleaved):
    """Independent form: pairs as complex numbers multiplied by e^{i m theta} in float64."""
    rope = RoPE(DIMS, rotary_interleaved=interleaved, rotary_percentage=0.75 if interleaved else 1.0)
    x = torch.randn(2, 2, 9, 32)
    pos = torch.randint(0, 10_000, (2, 9))
    ours, _ = rope.rotate(x, x, pos, pos)
    reference = apply_rotary_reference(x, pos, rope.inv_freq, interleaved)
    torch.testing.assert_close(ours.double(), reference, rtol=1e-5, atol=1e-5)


def test_rotation_preserves_norm_and_matches_gradient_path():
    rope = RoPE(DIMS)
    x = torch.randn(1, 2, 7, 32, requires_grad=True)
    pos = torch.arange(7)[None]
    with_grad, _ = rope.rotate(x, x, pos, pos)
    with torch.no_grad():
        fast, _ = rope.rotate(x, x, pos, pos)
    torch.testing.assert_close(with_grad, fast)
    torch.testing.assert_close(with_grad.norm(dim=-1), x.norm(dim=-1))
    with_grad.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_percentage_half_leaves_second_half_untouched(interleaved):
    rope = RoPE(DIMS, rotary_percentage=0.5, rotary_interleaved=interleaved)
    x = torch.randn(1, 2, 6, 32)
    pos = torch.arange(100, 106)[None]
    out, _ = rope.rotate(x, x, pos, pos)
    assert torch.equal(out[..., 16:], x[..., 16:])
    assert not torch.allclose(out[..., :16], x[..., :16])


def test_position_interpolation_factor_2_at_2m_equals_rope_at_m():
    plain = RoPE(DIMS)
    pi = RoPE(DIMS, rope_scaling={"rope_type": "linear", "factor": 2.0})
    x = torch.randn(1, 2, 5, 32)
    m = torch.tensor([[0, 3, 17, 1000, 4095]])
    a, _ = plain.rotate(x, x, m, m)
    b, _ = pi.rotate(x, x, 2 * m, 2 * m)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_inverse_frequencies_follow_the_paper():
    """theta_i = 10000^(-2i/d) (Su et al. eq. 15)."""
    expected = torch.tensor([10000 ** (-2 * i / 32) for i in range(16)], dtype=torch.float32)
    torch.testing.assert_close(inv_frequencies(32, 10000.0), expected)


@pytest.mark.parametrize("interleaved", [False, True])
def test_angles_stay_precise_at_a_million_positions(interleaved):
    """The rotation at m ~ 1e6 equals an independent numpy float64 rotation to float32 rounding; with
    float32 angles (m * theta rounded to 24 bits) it would be off by up to ~0.03 here."""
    rope = RoPE(DIMS, rotary_interleaved=interleaved)
    x = torch.randn(1, 2, 3, 32)
    pos = torch.tensor([[999_998, 999_999, 1_000_000]])
    ours, _ = rope.rotate(x, x, pos, pos)
    torch.testing.assert_close(ours.double(), numpy_rotate(x, pos, rope.inv_freq, interleaved), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("scale_base", [512.0, 2048.0])
@pytest.mark.parametrize("m,n", [(10, 3), (600, 0), (2000, 1999), (12_000, 11_000)])
def test_xpos_pair_score_is_zeta_to_the_offset_times_cosine(interleaved, scale_base, m, n):
    """Sun et al. eq. 9-10: for q = k = e_pair(i), q_m.k_n = zeta_i^((m-n)/scale_base) cos((m-n) theta_i)."""
    xpos = XPos(DIMS, xpos_scale_base=scale_base, rotary_interleaved=interleaved)
    log_zeta = xpos_log_zeta(32)
    for i in (0, 7, 15):
        e = torch.zeros(1, 1, 1, 32)
        e[..., 2 * i if interleaved else i] = 1.0  # the first component of pair i: (2i, 2i+1) or (i, i+16)
        got = rotated_dot(xpos, e, e, m, n)[0].item()
        theta = 10000 ** (-2 * i / 32)
        expected = math.exp(log_zeta[i].item() * (m - n) / scale_base) * math.cos((m - n) * theta)
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6), i


def test_xpos_zeta_values_from_the_paper():
    d = 32
    zeta = xpos_log_zeta(d).exp()
    expected = torch.tensor([(2 * i + 0.4 * d) / (1.4 * d) for i in range(d // 2)], dtype=torch.float64)
    torch.testing.assert_close(zeta, expected)
    assert (zeta < 1).all()  # keys far in the past decay


def test_xpos_score_depends_only_on_offset_within_its_exact_span_and_is_always_finite():
    xpos = XPos(DIMS, xpos_scale_base=512.0)
    span = xpos_exact_span(32, 512.0)
    assert 16_000 < span < 17_000  # ~32 * scale_base, as documented
    q, k = unit_vectors(3)
    near = rotated_dot(xpos, q, k, 130, 100)
    torch.testing.assert_close(near, rotated_dot(xpos, q, k, int(span) - 1, int(span) - 31), rtol=1e-4, atol=1e-5)
    for far in (100_000, 1_000_000):
        assert torch.isfinite(rotated_dot(xpos, q, k, far, far - 30)).all()


def test_xpos_model_is_exact_at_a_million_positions():
    """The model measures xPos positions from the first token, so an offset of 1e6 changes nothing."""
    from tests.conftest import tiny_gpt

    model = tiny_gpt("xpos", xpos_scale_base=512.0)
    ids = torch.randint(0, 61, (1, 20))
    pos = torch.arange(20)[None]
    torch.testing.assert_close(model(ids, position_ids=pos), model(ids, position_ids=pos + 1_000_000))
    cached = model.generate(ids, 5, use_cache=True, position_ids=pos + 1_000_000)
    assert torch.equal(cached, model.generate(ids, 5, use_cache=False, position_ids=pos + 1_000_000))
