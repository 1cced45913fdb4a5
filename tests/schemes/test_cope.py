"""CoPE (Golovneva et al. 2024): the vectorised bias equals the paper's formula evaluated pair by
pair; contextual positions behave as counts; the KV cache sees the same positions."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.content.cope import CoPE, contextual_positions
from posenc.models import GPTConfig
from posenc.scheme import Dims
from tests.conftest import tiny_gpt


def naive_cope_bias(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The paper's formulas with Python floats, one (head, i, j) at a time; future pairs get 0."""
    b, h, tq, dh = q.shape
    hkv, tk, npos = k.shape[1], k.shape[2], table.shape[0]
    q64, k64, e = q.double().tolist(), k.double().tolist(), table.double().tolist()
    out = torch.zeros(b, h, tq, tk, dtype=torch.float64)
    dot = lambda u, v: sum(x * y for x, y in zip(u, v, strict=True))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hkv)  # GQA: query head hi reads key head kh
            for i in range(tq):
                qi, last = q64[bi][hi][i], tk - tq + i  # this query sits at key index `last`
                for j in range(last + 1):
                    gates = [1 / (1 + math.exp(-dot(qi, k64[bi][kh][t]) / math.sqrt(dh))) for t in range(j, last + 1)]
                    p = min(sum(gates), npos - 1)
                    lo, hi_ = math.floor(p), math.ceil(p)
                    frac = p - lo
                    e_p = [frac * a + (1 - frac) * c for a, c in zip(e[hi_], e[lo], strict=True)]
                    out[bi, hi, i, j] = dot(qi, e_p)
    return out


def _qk(b=2, h=4, hkv=2, tq=5, tk=7, dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, tq, dh, generator=g), torch.randn(b, hkv, tk, dh, generator=g)


@pytest.mark.parametrize("npos", [3, 64])  # 3: positions clip at npos - 1
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_bias_equals_the_formula_pair_by_pair(npos, dtype, tolerance):
    """float32 gates and counts for float32 (and 16-bit) inputs; float64 ones for float64 inputs, exact."""
    q, k = (t.to(dtype) for t in _qk())
    scheme = CoPE(Dims(32, 4, 8, 64, n_kv_head=2), cope_npos_max=npos).to(dtype)
    with torch.no_grad():
        scheme.table.copy_(torch.randn(npos, 8, generator=torch.Generator().manual_seed(1)))
    got = scheme.bias(torch.zeros(2, 5), torch.zeros(2, 7), q, k)  # positions are ignored
    assert got.dtype == dtype
    causal = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=2)  # queries are the last 5 of 7 keys
    want = naive_cope_bias(q, k, scheme.table)
    torch.testing.assert_close(got.double() * causal, want, rtol=tolerance, atol=tolerance)


def test_gates_make_positions_count_and_grow_with_distance():
    q, k = _qk(tq=9, tk=9, hkv=4)
    p = contextual_positions(q, k)  # (B,H,9,9)
    diag = p.diagonal(dim1=-2, dim2=-1)
    assert ((diag > 0) & (diag < 1)).all()  # p_ii = g_ii, a gate in (0, 1)
    for i in range(9):
        row = p[..., i, : i + 1]
        assert (row[..., :-1] > row[..., 1:]).all()  # farther keys: strictly larger positions
        assert (row <= i + 1).all()  # at most one count per token
        assert (p[..., i, i + 1:] == 0).all()  # future keys count nothing


def test_positions_of_new_queries_match_the_full_computation():
    """The KV cache case: the last 3 queries against all 9 keys give the full rows."""
    q, k = _qk(tq=9, tk=9)
    torch.testing.assert_close(contextual_positions(q[..., -3:, :], k), contextual_positions(q, k)[..., -3:, :])


def test_cached_logits_equal_uncached(tokens):
    model = tiny_gpt("cope", n_kv_head=2)
    cache = model.new_cache()
    parts = [model(tokens[:, :11], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(11, 24)]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(tokens), rtol=1e-4, atol=1e-4)


def test_each_layer_owns_a_table_and_the_table_matters(tokens):
    model = tiny_gpt("cope")
    assert len(model.schemes) == model.cfg.n_layer
    before = model(tokens)
    with torch.no_grad():
        model.schemes[1].table.add_(torch.randn(model.schemes[1].table.shape))  # a constant would cancel
    assert not torch.allclose(before, model(tokens), atol=1e-3)


def test_npos_max_is_validated():
    with pytest.raises(ValueError, match=r"cope_npos_max=0"):
        GPTConfig(position_embedding_type="cope", cope_npos_max=0)
