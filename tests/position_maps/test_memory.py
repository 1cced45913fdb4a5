"""Memory stays O(chunk x Tk): no tensor of H x T x T scores is ever made. Every tensor an op creates is seen
through a dispatch hook; the same hook sees dense attention's (H,T,T) scores, so it can fail."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from posenc.nn import mapped_attention as engine
from posenc.nn.attention_core import attend_eager
from tests.position_maps.test_properties import SMALL, _ids
from tests.position_maps.tiny import tiny_llama, token_ids


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def test_the_hook_sees_dense_scores():
    q, k, v = torch.randn(1, 4, 256, 16), torch.randn(1, 2, 256, 16), torch.randn(1, 2, 256, 16)
    with LargestTensor() as seen:
        attend_eager(q, k, v, None, causal=True)
    assert seen.numel >= 4 * 256 * 256


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_a_long_forward_never_holds_h_t_t_scores(spec, monkeypatch):
    t, heads = 1024, 4
    monkeypatch.setattr(engine, "SCORE_BUDGET", 1 << 14)  # 4 query rows per chunk at T = 1024
    model = tiny_llama(attention_extension=spec, dtype=torch.float32)
    ids = token_ids(1, t)
    with LargestTensor() as seen:
        model(ids)
    # the largest tensors are O(T): q (H*T*Dh = 65,536 elements), the logits (T*V); H*T*T = 4,194,304
    assert seen.numel <= heads * t * t // 32


def test_chunk_rows_keep_scores_within_the_budget_at_64k():
    rows = engine.chunk_rows(1, 9, 65536, 65536)  # SmolLM2-135M: 9 heads
    assert rows >= 1 and rows * 9 * 65536 <= engine.SCORE_BUDGET
    assert engine.chunk_rows(1, 9, 10, 65536) <= 10  # never more rows than queries
    assert engine.chunk_rows(2, 9, 65536, 65536, budget=1) == 1  # at least one row
    assert engine.chunk_rows(1, 4, 100, 100) == 100  # short inputs: one chunk
    assert engine.chunk_rows(1, 4, 4096, 4096) == engine.MAX_ROWS


def test_query_chunks_cover_every_row_once_and_align_to_the_period():
    first_row = torch.arange(3, 40)  # positions 3..39, period 8: cuts at rows 5, 13, 21, 29
    chunks = engine.query_chunks(first_row, 6, 8)
    assert [r for a, b in chunks for r in range(a, b)] == list(range(37))
    assert all(b - a <= 6 for a, b in chunks)
    assert all(int(first_row[a]) // 8 == int(first_row[b - 1]) // 8 for a, b in chunks)  # one DCA chunk each
    assert engine.query_chunks(first_row, 100, None) == [(0, 37)]
