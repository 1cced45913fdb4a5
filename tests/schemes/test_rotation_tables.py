"""Scheme.rotation_tables is rotate() as tables: for every registered scheme that gives them, applying the tables is
rotate(), bit for bit, for a decode step's positions (keys at the queries' positions) and for a prompt's."""

from __future__ import annotations

import pytest
import torch

from posenc.registry import SCHEMES
from posenc.rotary import apply_rotary
from posenc.scheme import Dims, Scheme

GIVES_TABLES = sorted(name for name, cls in SCHEMES.items() if cls.rotation_tables is not Scheme.rotation_tables)


def test_the_rotary_family_gives_tables():
    assert {"rope", "xpos", "p_rope"} <= set(GIVES_TABLES)


@pytest.mark.parametrize("name", GIVES_TABLES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_applying_the_tables_is_rotate(name, dtype):
    scheme = SCHEMES[name](Dims(d_model=32, n_head=4, head_dim=8, max_seq_len=64, n_kv_head=2))
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8, generator=gen, dtype=dtype), torch.randn(2, 2, 5, 8, generator=gen, dtype=dtype)
    for q_pos, k_pos in ((torch.tensor([[7], [30]]), None), (torch.arange(3, 8).expand(2, 5), None),
                         (torch.arange(5).expand(2, 5), torch.arange(40, 45).expand(2, 5))):
        k_pos = q_pos if k_pos is None else k_pos
        qs, ks = q[:, :, : q_pos.shape[1]], k[:, :, : k_pos.shape[1]]
        want = scheme.rotate(qs, ks, q_pos, k_pos)
        t = scheme.rotation_tables(q_pos, k_pos)
        got = apply_rotary(qs, t.cos_q, t.sin_q, t.interleaved), apply_rotary(ks, t.cos_k, t.sin_k, t.interleaved)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
