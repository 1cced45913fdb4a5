"""slot_attention (posenc.nn.static_attention) equals the float64 attention of one query over the filled slots, and
takes SDPA's output in whatever memory order the device's kernel returns it (CUDA's flash and memory-efficient
kernels hand back (B, Hkv, g, Dh) as a transposed view)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posenc.nn import static_attention


def slots(b=2, h=4, hkv=2, filled=5, empty=3, dh=8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, 1, dh, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, filled + empty, dh, generator=g, dtype=torch.float64) for _ in range(2))
    row = torch.cat([torch.randn(1, h, 1, filled, generator=g, dtype=torch.float64),
                     torch.full((1, h, 1, empty), float("-inf"), dtype=torch.float64)], -1)
    return q, k, v, row, filled


def expected(q, k, v, row, filled):
    k, v = (t[:, :, :filled].repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + row[..., :filled]
    return scores.softmax(-1) @ v


def test_slot_attention_equals_attention_over_the_filled_slots():
    q, k, v, row, filled = slots()
    torch.testing.assert_close(static_attention.slot_attention(q, k, v, row), expected(q, k, v, row, filled))


def test_an_output_in_another_memory_order_is_taken(monkeypatch):
    """As on CUDA: SDPA returns a view whose last two dimensions are not contiguous with the first two."""
    q, k, v, row, filled = slots()
    sdpa = F.scaled_dot_product_attention

    def transposed_sdpa(*args, **kwargs):
        out = sdpa(*args, **kwargs)  # (b, hkv, g, dh)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(static_attention.F, "scaled_dot_product_attention", transposed_sdpa)
    torch.testing.assert_close(static_attention.slot_attention(q, k, v, row), expected(q, k, v, row, filled))
