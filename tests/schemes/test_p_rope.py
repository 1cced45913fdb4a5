"""p-RoPE (Barbero et al. 2024): p = 1 is RoPE, p = 0 is NoPE, and in between only the
lowest frequencies stop rotating."""

from __future__ import annotations

import pytest
import torch

from posenc.rotary.p_rope import PRoPE, kept_pairs
from posenc.rotary.rope import RoPE
from posenc.scheme import Dims
from tests.conftest import VOCAB, tiny_gpt

DIMS = Dims(d_model=64, n_head=2, head_dim=32, max_seq_len=128)


def qk_and_positions(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, 10, 32, generator=g), torch.randn(2, 2, 10, 32, generator=g)
    pos = torch.randint(0, 5000, (2, 10), generator=g)
    return q, k, pos


@pytest.mark.parametrize("interleaved", [False, True])
def test_p_one_rotates_exactly_like_rope(interleaved):
    q, k, pos = qk_and_positions()
    ours = PRoPE(DIMS, p_rope_fraction=1.0, rotary_interleaved=interleaved).rotate(q, k, pos, pos)
    rope = RoPE(DIMS, rotary_interleaved=interleaved).rotate(q, k, pos, pos)
    for a, b in zip(ours, rope, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_p_zero_leaves_q_and_k_unrotated(interleaved):
    q, k, pos = qk_and_positions()
    qr, kr = PRoPE(DIMS, p_rope_fraction=0.0, rotary_interleaved=interleaved).rotate(q, k, pos, pos)
    torch.testing.assert_close(qr, q, rtol=0, atol=0)
    torch.testing.assert_close(kr, k, rtol=0, atol=0)


def test_gpt_logits_p_one_equal_rope_and_p_zero_equal_nope(tokens):
    pos = torch.arange(tokens.shape[1]).expand_as(tokens) + 1000
    torch.testing.assert_close(tiny_gpt("p_rope", p_rope_fraction=1.0)(tokens, pos), tiny_gpt("rope")(tokens, pos),
                               rtol=0, atol=0)
    torch.testing.assert_close(tiny_gpt("p_rope", p_rope_fraction=0.0)(tokens, pos), tiny_gpt("none")(tokens, pos),
                               rtol=0, atol=0)
    assert tiny_gpt("p_rope")(tokens).shape == (*tokens.shape, VOCAB)


def test_only_the_lowest_frequency_pairs_pass_through():
    """Half-split pairs (i, i + 16): with p = 0.75 of 16 pairs, pairs 12..15 keep their values."""
    q, k, pos = qk_and_positions()
    scheme = PRoPE(DIMS, p_rope_fraction=0.75)
    qr, _ = scheme.rotate(q, k, pos, pos)
    frozen = torch.tensor([12, 13, 14, 15, 28, 29, 30, 31])
    torch.testing.assert_close(qr[..., frozen], q[..., frozen], rtol=0, atol=0)
    assert (qr[..., :12] - q[..., :12]).abs().max() > 0.1
    assert (scheme.inv_freq[:12] > 0).all() and (scheme.inv_freq[12:] == 0).all()


def test_kept_pairs_rounds_and_scalings_act_before_the_cut():
    assert [kept_pairs(16, p) for p in (0.0, 0.25, 0.5, 0.75, 1.0)] == [0, 4, 8, 12, 16]
    scaled = PRoPE(DIMS, p_rope_fraction=0.5, rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(scaled.inv_freq[:8], RoPE(DIMS).inv_freq[:8] / 2)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True])
def test_bad_fraction_names_the_field(bad):
    with pytest.raises(ValueError, match="p_rope_fraction"):
        tiny_gpt("p_rope", p_rope_fraction=bad)
