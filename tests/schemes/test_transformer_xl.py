"""Transformer-XL (Dai et al. 2019): the bias equals the paper's four-term score, and the gather on
distances equals the paper's relative-shift trick where that trick applies."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.content.transformer_xl import TransformerXL
from posenc.models import T5Config
from posenc.nn.attention import attend_eager
from posenc.scheme import Dims


def sinusoid(r: torch.Tensor, d: int) -> torch.Tensor:
    """R_r with sin on even, cos on odd dims (the order is immaterial: W_R is learned)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = r.to(torch.float64)[..., None] * inv_freq
    return torch.stack((angle.sin(), angle.cos()), -1).flatten(-2).float()  # (..., d)


def naive_scores(scheme: TransformerXL, q, k, q_pos, k_pos):
    """A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}, all / sqrt(Dh), term by term."""
    _, h, _, dh = q.shape
    k = k.repeat_interleave(h // k.shape[1], 1)  # (B,H,Tk,Dh)
    r = sinusoid(q_pos[:, :, None] - k_pos[:, None, :], scheme.dims.d_model)  # (B,Tq,Tk,D)
    wr = (r @ scheme.w_r.weight.T).view(*r.shape[:3], h, dh)  # (B,Tq,Tk,H,Dh): W_R R_{i-j}
    a = torch.einsum("bhid,bhjd->bhij", q, k)
    b_term = torch.einsum("bhid,bijhd->bhij", q, wr)
    c_term = torch.einsum("hd,bhjd->bhj", scheme.u, k)[:, :, None, :]
    d_term = torch.einsum("hd,bijhd->bhij", scheme.v, wr)
    return (a + b_term + c_term + d_term) / math.sqrt(dh)


def make(n_head: int = 4, n_kv_head: int = 4, head_dim: int = 8, seed: int = 0) -> TransformerXL:
    torch.manual_seed(seed)
    scheme = TransformerXL(Dims(n_head * head_dim, n_head, head_dim, 64, True, n_kv_head))
    with torch.no_grad():  # unit-scale parameters so every term is visible
        for p in scheme.parameters():
            p.normal_()
    return scheme


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_bias_plus_content_equals_four_term_formula(n_kv_head):
    scheme = make(n_kv_head=n_kv_head)
    q, k = torch.randn(2, 4, 7, 8), torch.randn(2, n_kv_head, 11, 8)
    k_pos = torch.arange(11).expand(2, 11) + torch.tensor([[0], [5]])  # rows at different offsets
    q_pos = k_pos[:, -7:]  # queries are the last 7 keys, as with a cache
    scores = q @ k.repeat_interleave(4 // n_kv_head, 1).transpose(-1, -2) / math.sqrt(8)  # SDPA's term (a)
    got = scores + scheme.bias(q_pos, k_pos, q, k)
    torch.testing.assert_close(got, naive_scores(scheme, q, k, q_pos, k_pos), rtol=1e-4, atol=1e-4)


def relative_shift(x: torch.Tensor) -> torch.Tensor:
    """The paper's trick (App. B): x[..., i, j'] scores distance Tk-1-j'; pad, reshape, drop a row."""
    b, h, tq, tk = x.shape
    padded = torch.cat((x.new_zeros(b, h, tq, 1), x), -1).view(b, h, tk + 1, tq)
    return padded[:, :, 1:].reshape(b, h, tq, tk)  # [..., i, j] now scores distance i + (Tk-Tq) - j


def test_gather_on_distances_equals_relative_shift_in_the_causal_region():
    scheme = make()
    tq, tk = 5, 9
    q, k = torch.randn(1, 4, tq, 8), torch.zeros(1, 4, tk, 8)  # k = 0 drops term (c)
    k_pos, q_pos = torch.arange(tk)[None], torch.arange(tk - tq, tk)[None]
    with torch.no_grad():
        rk = scheme.projected_distances(0, tk - 1, q).flip(1)  # (H,Tk,Dh), distances Tk-1 .. 0
        shifted = relative_shift((q + scheme.v[:, None]) @ rk.transpose(-1, -2)) / math.sqrt(8)
        gathered = scheme.bias(q_pos, k_pos, q, k)
    causal = k_pos[0][None, :] <= q_pos[0][:, None]  # (Tq,Tk): where the shift trick is valid
    torch.testing.assert_close(gathered[..., causal], shifted[..., causal], rtol=1e-5, atol=1e-5)


def test_masked_attention_rows_sum_to_one_and_ignore_the_future():
    scheme = make()
    q, k, v = torch.randn(3, 1, 4, 6, 8).unbind(0)
    pos = torch.arange(6)[None]
    _, weights = attend_eager(q, k, v, scheme.bias(pos, pos, q, k), causal=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 6))
    assert (weights.triu(1) == 0).all()


def test_transformer_xl_is_refused_by_the_encoder_with_the_allowed_list():
    with pytest.raises(ValueError) as err:
        T5Config(encoder_position_embedding_type="transformer_xl")
    message = str(err.value)
    assert "encoder_position_embedding_type" in message and "encoder" in message and "relative" in message
    T5Config(decoder_position_embedding_type="transformer_xl")  # the decoder takes it


def test_fast_path_rows_in_query_chunks_equal_the_bias_with_gradients(monkeypatch):
    """Long inputs multiply only the part of each row attention reads (chunks of queries): outputs and
    gradients equal the reference bias path."""
    from posenc.nn import dispatch, native, triangular
    from posenc.nn.attention_core import attend

    if not native.has_gemm():
        pytest.skip("native kernels not built on this machine")
    monkeypatch.setattr(triangular, "CHUNK", 8)
    torch.manual_seed(0)
    scheme = TransformerXL(Dims(64, 4, 16, 128, True, 4))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 37, 16, generator=g, requires_grad=True) for _ in range(3))
    pos = torch.arange(37).expand(2, 37) + 5
    fast = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    ref = attend(q, k, v, scheme.bias(pos, pos, q, k), True)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    inputs = [q, k, v, *scheme.parameters()]
    for a, b in zip(torch.autograd.grad(fast.sum(), inputs), torch.autograd.grad(ref.sum(), inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
