"""Sliding-window attention block by block (posenc/nn/sliding_window.py) computes the dense mask's own pairs: equal
to one (Tq, Tk) mask in float64 (prefill, a chunk after a cache, batch rows at different offsets, GQA, a bias,
Gemma 2's soft-cap), kept off where positions do not count up, and, in the families that slide, equal to
transformers' own models through the blocks (blocks forced small, so a 24-token prompt spans several)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import sliding_window
from posenc.nn.decoder_attention import masked_attention
from posenc.nn.sliding_window import sliding_attention

W = 5


def dense(q, k, v, q_pos, k_pos, bias, softcap):
    tq, tk = q.shape[-2], k.shape[-2]
    causal = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + (tk - tq)
    near = q_pos[:, :, None] - k_pos[:, None, :] < W
    return masked_attention(q, k, v, bias, (causal & near)[:, None], softcap)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sliding_window, "BLOCK_MIN", 4)  # blocks of 2W = 10 queries


@pytest.mark.parametrize("tq, tk, hkv, with_bias, softcap", [
    (40, 40, 2, False, None),   # a prefill, MHA
    (17, 43, 1, False, None),   # a chunk after a 26-token cache, GQA 2:1
    (1, 43, 1, False, None),    # a decode step
    (23, 40, 2, True, 3.0),     # a bias and soft-capping
])
def test_blocks_equal_the_dense_mask(small_blocks, tq, tk, hkv, with_bias, softcap):
    g = torch.Generator().manual_seed(tq * tk)
    q = torch.randn(2, 2, tq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, hkv, tk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k_pos = torch.arange(tk)[None] + torch.tensor([[0], [7]])  # rows at different offsets
    q_pos = k_pos[:, tk - tq:]
    full_bias = torch.randn(2, 2, tq, tk, generator=g, dtype=torch.float64) if with_bias else None
    bias_of = (lambda rows, cols: full_bias[:, :, rows, cols]) if with_bias else (lambda rows, cols: None)
    calls = []

    def attend(q, k, v, bias, allowed):
        calls.append(k.shape[-2])
        return masked_attention(q, k, v, bias, allowed, softcap)

    out = sliding_attention(q, k, v, q_pos, k_pos, W, bias_of, attend)
    assert out is not None and max(calls) < tk  # several blocks, none over every key
    torch.testing.assert_close(out, dense(q, k, v, q_pos, k_pos, full_bias, softcap), rtol=1e-12, atol=1e-12)


def test_positions_that_do_not_count_up_keep_the_dense_mask(small_blocks):
    q = k = v = torch.randn(1, 1, 40, 8)
    pos = torch.arange(40)[None] * 2  # gaps: a key's distance is not its index difference
    assert sliding_attention(q, k, v, pos, pos, W, lambda r, c: None, lambda *a: a[0]) is None


def test_a_short_sequence_keeps_the_dense_mask():
    q = k = v = torch.randn(1, 1, 40, 8)
    pos = torch.arange(40)[None]
    assert sliding_attention(q, k, v, pos, pos, W, lambda r, c: None, lambda *a: a[0]) is None  # 40 <= 256 + W


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_sliding_families_equal_transformers_through_the_blocks(tmp_path, monkeypatch, family):
    pytest.importorskip("transformers")
    from tests.models.test_families import build, compare

    monkeypatch.setattr(sliding_window, "BLOCK_MIN", 2)
    seen = []
    real = sliding_window.sliding_attention

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out is not None)
        return out

    monkeypatch.setattr("posenc.nn.decoder_attention.sliding_attention", spy)
    compare(build(family, tmp_path))
    assert any(seen)  # the blocks ran (the prefill of 24 tokens and the steps past the window)
