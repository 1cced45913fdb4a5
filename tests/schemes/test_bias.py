"""ALiBi, KERPLE and Sandwich biases against the papers' formulas and stated values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posenc.bias.alibi import ALiBi, alibi_slopes
from posenc.bias.kerple import KERPLE
from posenc.bias.sandwich import Sandwich
from posenc.scheme import Dims


def dims(n_head: int = 8, d_model: int = 64) -> Dims:
    return Dims(d_model=d_model, n_head=n_head, head_dim=d_model // n_head, max_seq_len=64)


def test_alibi_slopes_for_8_heads_are_powers_of_one_half():
    expected = torch.tensor([2.0**-i for i in range(1, 9)])
    torch.testing.assert_close(alibi_slopes(8), expected)


def test_alibi_slopes_for_6_and_12_heads_follow_the_papers_interleave_rule():
    """Press et al.'s get_slopes: the 4 (or 8) power-of-two slopes, then every other slope of 8 (16)."""
    six = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    twelve = [2.0**-i for i in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(six))
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(twelve))


def test_alibi_bias_is_minus_slope_times_distance_and_symmetric():
    alibi = ALiBi(dims())
    pos = torch.arange(10)[None]
    bias = alibi.bias(pos, pos)[0]  # (H,T,T)
    for h, slope in enumerate(alibi_slopes(8).tolist()):
        for m, n in [(9, 0), (5, 5), (3, 7)]:
            assert bias[h, m, n].item() == pytest.approx(-slope * abs(m - n))
    torch.testing.assert_close(bias, bias.transpose(-1, -2))  # the T5 encoder uses it both ways


def test_alibi_partial_heads_leaves_the_rest_unbiased():
    alibi = ALiBi(dims(), num_attention_heads_alibi=4)
    torch.testing.assert_close(alibi.slopes[:4], alibi_slopes(4))
    assert torch.equal(alibi.slopes[4:], torch.zeros(4))
    with pytest.raises(ValueError, match="num_attention_heads_alibi"):
        ALiBi(dims(), num_attention_heads_alibi=9)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_matches_formula_and_starts_from_alibi_slopes(kernel):
    kerple = KERPLE(dims(), kerple_kernel=kernel)
    torch.testing.assert_close(kerple.b, alibi_slopes(8), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kerple.a, torch.ones(8), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kerple.p, torch.ones(8), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        kerple.kerple_b.add_(torch.linspace(0, 1, 8))
        kerple.kerple_a.add_(torch.linspace(-0.5, 0.5, 8))
        kerple.kerple_p.add_(torch.linspace(-0.7, 0.7, 8))
    pos = torch.arange(12)[None]
    bias = kerple.bias(pos, pos)[0].detach().double().numpy()
    b, a, p = (x.detach().double().numpy() for x in (kerple.b, kerple.a, kerple.p))
    d = np.abs(np.arange(12)[:, None] - np.arange(12)[None, :])
    for h in range(8):
        expected = -b[h] * (np.log(1 + a[h] * d ** p[h]) if kernel == "log" else d ** p[h])
        np.testing.assert_allclose(bias[h], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_gradients_flow_and_parameters_stay_in_their_domain(kernel):
    kerple = KERPLE(dims(), kerple_kernel=kernel)
    opt = torch.optim.SGD([p for p in kerple.parameters() if p.requires_grad], lr=50.0)
    pos = torch.arange(16)[None]
    for step in range(20):  # push every bias up hard: b (and a) are driven towards zero
        loss = -kerple.bias(pos, pos).sum()
        opt.zero_grad()
        loss.backward()
        if step == 0:
            assert (kerple.kerple_b.grad != 0).all() and (kerple.kerple_p.grad != 0).all()
            assert (kerple.kerple_a.grad != 0).all() if kernel == "log" else kerple.kerple_a.grad is None
        opt.step()
    assert (kerple.b >= 0).all() and (kerple.a >= 0).all() and (kerple.p > 0).all() and (kerple.p <= 2).all()


def test_kerple_parameters_take_additive_steps_as_in_nemo():
    """One Adam step moves every b by about lr, the 2^-8 head as much as the 2^-1 head (NeMo and the
    paper's code learn the values directly). The old softplus form moved b by ~lr * b, so in
    `make demo`'s 400 steps no head could grow more than ~1.9x (COMPARE.md)."""
    kerple = KERPLE(dims())
    before = kerple.b.detach().clone()
    opt = torch.optim.Adam([p for p in kerple.parameters() if p.requires_grad], lr=1e-2)
    pos = torch.arange(16)[None]
    kerple.bias(pos, pos).sum().backward()  # d/db < 0 for every head: a step raises every b
    opt.step()
    torch.testing.assert_close(kerple.b.detach() - before, torch.full((8,), 1e-2), rtol=1e-3, atol=0.0)


def test_kerple_clamped_parameter_returns_when_the_loss_asks():
    kerple = KERPLE(dims())
    with torch.no_grad():
        kerple.kerple_b.fill_(-0.1)  # one step past the bound b >= 0
    assert torch.equal(kerple.b.detach(), torch.zeros(8))
    pos = torch.arange(16)[None]
    kerple.bias(pos, pos).sum().backward()  # descent raises b: back into the domain, gradient passes
    assert (kerple.kerple_b.grad < 0).all()
    kerple.kerple_b.grad = None
    (-kerple.bias(pos, pos).sum()).backward()  # descent lowers b further: blocked
    assert torch.equal(kerple.kerple_b.grad, torch.zeros(8))


def test_kerple_with_fixed_p_is_the_papers_two_parameter_log_kernel():
    kerple = KERPLE(dims(), kerple_kernel="log", kerple_learn_p=False)
    assert not kerple.kerple_p.requires_grad
    pos = torch.arange(8)[None]
    kerple.bias(pos, pos).sum().backward()
    assert kerple.kerple_p.grad is None
    torch.testing.assert_close(kerple.p, torch.ones(8))
    with pytest.raises(ValueError, match="kerple_learn_p"):
        KERPLE(dims(), kerple_kernel="power", kerple_learn_p=False)


def test_kerple_rejects_unknown_kernel():
    with pytest.raises(ValueError, match=r"kerple_kernel='cubic'.*log, power"):
        KERPLE(dims(), kerple_kernel="cubic")


def test_sandwich_equals_inner_product_of_sinusoids_compressed_per_head():
    """Chi et al. 2023: (sum_{k=1..d/2} cos(|m-n| 10000^(-2k/d)) - d/2) / (8h/H), d the head dim."""
    d, heads = 64, 8
    sandwich = Sandwich(dims(heads, d * heads))
    pos = torch.arange(40)[None] + 1000
    bias = sandwich.bias(pos, pos)[0].double().numpy()
    k = np.arange(1, d // 2 + 1)
    w = 10000.0 ** (-2 * k / d)
    for m, n in [(0, 0), (39, 0), (10, 30), (20, 19)]:
        s = np.cos(abs(m - n) * w).sum()
        for h in range(1, heads + 1):
            assert bias[h - 1, m, n] == pytest.approx((s - d / 2) / (8 * h / heads), rel=1e-5, abs=1e-5)
    assert (bias <= 1e-6).all() and bias[0, 0, 0] == pytest.approx(0.0, abs=1e-5)


def test_sandwich_grows_its_table_past_max_seq_len():
    sandwich = Sandwich(dims())  # head dim 8
    q_pos, k_pos = torch.tensor([[5000]]), torch.tensor([[0, 4999]])
    bias = sandwich.bias(q_pos, k_pos)
    w = 10000.0 ** (-2 * np.arange(1, 5) / 8)
    assert bias[0, 0, 0, 0].item() == pytest.approx((np.cos(5000 * w).sum() - 4) / 1.0, rel=1e-5)
    assert math.isfinite(bias.abs().max().item())
