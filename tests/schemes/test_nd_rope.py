"""N-d (axial) RoPE: q . k depends only on the grid offset; one axis is RoPE; it runs in
posenc's SelfAttention and KV cache with grid positions unchanged."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.nn.attention import SelfAttention
from posenc.nn.kv_cache import KVCache
from posenc.rotary.nd import NdRoPE, axis_pairs
from posenc.rotary.rope import RoPE
from posenc.scheme import Dims

DIMS = Dims(d_model=64, n_head=2, head_dim=32, max_seq_len=128)


def score(scheme, q, k, p, p2) -> torch.Tensor:
    """q at grid point p, k at p2 (tuples); q . k per head in float64."""
    qr, _ = scheme.rotate(q, q, torch.tensor([[p]]), torch.tensor([[p]]))
    _, kr = scheme.rotate(k, k, torch.tensor([[p2]]), torch.tensor([[p2]]))
    return (qr.double() * kr.double()).sum(-1).flatten()


def vectors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 1, 32, generator=g), torch.randn(1, 2, 1, 32, generator=g)


coord = st.integers(0, 2000)


@pytest.mark.parametrize("interleaved", [False, True])
@settings(max_examples=30, deadline=None)
@given(y=coord, x=coord, y2=coord, x2=coord, dy=st.integers(-500, 5000), dx=st.integers(-500, 5000))
def test_2d_score_depends_only_on_the_offset(interleaved, y, x, y2, x2, dy, dx):
    scheme = NdRoPE(DIMS, n_axes=2, rotary_interleaved=interleaved)
    q, k = vectors()
    shifted = score(scheme, q, k, (y + dy + 500, x + dx + 500), (y2 + dy + 500, x2 + dx + 500))
    torch.testing.assert_close(score(scheme, q, k, (y, x), (y2, x2)), shifted, rtol=1e-4, atol=1e-4)


def test_2d_score_sees_both_axes_and_tells_them_apart():
    scheme, (q, k) = NdRoPE(DIMS, n_axes=2), vectors()
    at_rest = score(scheme, q, k, (5, 5), (5, 5))
    along_y, along_x = score(scheme, q, k, (8, 5), (5, 5)), score(scheme, q, k, (5, 8), (5, 5))
    assert (along_y - at_rest).abs().max() > 1e-2 and (along_x - at_rest).abs().max() > 1e-2
    assert (along_y - along_x).abs().max() > 1e-2


def test_3d_score_depends_only_on_the_offset():
    scheme = NdRoPE(Dims(96, 2, 48, 128), n_axes=3)
    q, k = torch.randn(1, 2, 1, 48), torch.randn(1, 2, 1, 48)
    base = score(scheme, q, k, (1, 2, 3), (7, 0, 9))
    torch.testing.assert_close(base, score(scheme, q, k, (101, 52, 33), (107, 50, 39)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("interleaved", [False, True])
def test_one_axis_is_rope(interleaved):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 9, 32, generator=g), torch.randn(2, 2, 9, 32, generator=g)
    pos = torch.randint(0, 9000, (2, 9), generator=g)
    rope = RoPE(DIMS, rotary_interleaved=interleaved).rotate(q, k, pos, pos)
    for positions in (pos, pos[..., None]):
        nd = NdRoPE(DIMS, n_axes=1, rotary_interleaved=interleaved).rotate(q, k, positions, positions)
        for a, b in zip(nd, rope, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_pairs_split_evenly_and_bad_axes_are_errors():
    assert axis_pairs(16, 2) == [8, 8] and axis_pairs(16, 3) == [6, 5, 5]
    with pytest.raises(ValueError, match="n_axes"):
        NdRoPE(DIMS, n_axes=0)
    with pytest.raises(ValueError, match=r"positions\.shape"):
        NdRoPE(DIMS, n_axes=2).tables(torch.zeros(1, 4, 3, dtype=torch.long))


def test_grid_positions_through_attention_and_kv_cache():
    """A 4x4 image in raster order: prefill 10 patches then one at a time == one full pass."""
    torch.manual_seed(0)
    attn, scheme = SelfAttention(64, 2, 2, causal=True).eval(), NdRoPE(DIMS, n_axes=2)
    x = torch.randn(1, 16, 64)
    pos = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"), -1).reshape(1, 16, 2)
    full = attn(x, scheme, pos, pos)
    cache, outs = KVCache(1), []
    for lo, hi in [(0, 10), *[(i, i + 1) for i in range(10, 16)]]:
        k_pos = cache.add_positions(pos[:, lo:hi])
        outs.append(attn(x[:, lo:hi], scheme, pos[:, lo:hi], k_pos, cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
